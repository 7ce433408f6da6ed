// SPDX-License-Identifier: Apache-2.0

package identitycell

// The identity shell commands: identity/list and identity/get, with the
// users other cells contribute.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// Users is a contribution to identity/list and identity/get: who, of one
// kind, uses an identity. The cells that know users of identities (the
// ipcache its prefixes, the endpoints theirs) contribute them through
// [UsersOut], so that this cell imports none of them.
type Users struct {
	// Kind names the users ("prefixes"): a key of -o json's users object
	// and a column of identity/list (the columns are in the order of the
	// kinds' names).
	Kind string
	// Lookup returns, for a snapshot, what tells the users of an
	// identity: how many there are, and the names of at most max of them.
	// It is called once per command, so that what many identities need
	// (a pass over a table) is done once.
	Lookup func(txn statedb.ReadTxn) func(ident *Identity, max int) (count int, first []string)
}

// UsersOut contributes [Users] to the identity commands.
type UsersOut struct {
	cell.Out
	Users []Users `group:"identity-users,flatten"`
}

// maxUsersShown bounds the names of each kind of users a command shows
// per identity: a CIDR identity has one prefix, a label identity the
// addresses of all its endpoints.
const maxUsersShown = 5

type commandParams struct {
	cell.In

	DB         *statedb.DB
	Identities statedb.Table[*Identity]
	Allocator  *Allocator
	Users      []Users `group:"identity-users"`
}

// identityJSON is an element of identity/list -o json, and identity/get
// -o json.
type identityJSON struct {
	Identity   identity.Number      `json:"identity"`
	Labels     []string             `json:"labels"`
	References uint32               `json:"references"`
	Withheld   bool                 `json:"withheld"`
	Users      map[string]usersJSON `json:"users"`
}

type usersJSON struct {
	Count int      `json:"count"`
	First []string `json:"first"`
}

type userLookup struct {
	kind   string
	lookup func(ident *Identity, max int) (int, []string)
}

type commands struct{ commandParams }

func newCommands(p commandParams) hive.ScriptCmdsOut {
	c := commands{p}
	return hive.NewScriptCmds(map[string]script.Cmd{
		"identity/list": c.list(),
		"identity/get":  c.get(),
	})
}

// lookups returns the contributed users' lookups for the snapshot, by
// kind: the columns come in one order, whatever the order of the cells.
func (c commands) lookups(txn statedb.ReadTxn) []userLookup {
	out := make([]userLookup, 0, len(c.Users))
	for _, u := range c.Users {
		out = append(out, userLookup{u.Kind, u.Lookup(txn)})
	}
	slices.SortStableFunc(out, func(a, b userLookup) int { return strings.Compare(a.kind, b.kind) })
	return out
}

func labelList(l labels.Labels) []string {
	out := []string{}
	for label := range l.All() {
		out = append(out, label)
	}
	return out
}

func (c commands) toJSON(ident *Identity, lookups []userLookup) identityJSON {
	out := identityJSON{Identity: ident.ID, Labels: labelList(ident.Labels), References: ident.References(),
		Withheld: ident.Withheld(), Users: map[string]usersJSON{}}
	for _, l := range lookups {
		count, first := l.lookup(ident, maxUsersShown)
		if first == nil {
			first = []string{}
		}
		out.Users[l.kind] = usersJSON{Count: count, First: first}
	}
	return out
}

// usersText is the first users joined, and how many more there are.
func usersText(count int, first []string) string {
	text := strings.Join(first, ",")
	if more := count - len(first); more > 0 {
		text += fmt.Sprintf(" (+%d more)", more)
	}
	return text
}

func title(kind string) string {
	if kind == "" {
		return kind
	}
	return strings.ToUpper(kind[:1]) + kind[1:]
}

func (c commands) list() script.Cmd {
	return scriptcmd.Show(
		script.CmdUsage{
			Summary: "List the allocated identities (local and label) with their references and users",
			Detail: []string{
				"Users are contributed by the cells that know them (the ipcache's",
				"prefixes and the resources that own them); each kind shows its first",
				"few and how many more.",
				"-o json: an array of objects (identity, labels, references, withheld,",
				"users: {kind: {count, first}}).",
			},
		},
		func(s *script.State, asJSON bool) (script.WaitFunc, error) {
			txn := c.DB.ReadTxn()
			lookups := c.lookups(txn)
			if asJSON {
				rows := []identityJSON{}
				for ident := range c.Identities.All(txn) {
					if ident.Allocated() {
						rows = append(rows, c.toJSON(ident, lookups))
					}
				}
				return scriptcmd.JSON(rows, nil)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprint(w, "ID\tReferences\tWithheld\t")
			for _, l := range lookups {
				fmt.Fprintf(w, "%s\t", title(l.kind))
			}
			fmt.Fprintln(w, "Labels")
			for ident := range c.Identities.All(txn) {
				if !ident.Allocated() {
					continue // only a tool builds such a row: no labels, no users
				}
				withheld := ""
				if ident.Withheld() {
					withheld = "withheld"
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t", ident.ID, ident.References(), withheld)
				for _, l := range lookups {
					fmt.Fprintf(w, "%s\t", usersText(l.lookup(ident, maxUsersShown)))
				}
				fmt.Fprintln(w, ident.Labels)
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		})
}

func (c commands) get() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Show an identity: labels, references, whether withheld, its users",
			Args:    "identity",
			Detail: []string{
				"A number withheld and not allocated shows with 0 references (and,",
				"for a label identity kept for its previous label set, those labels).",
				"-o json: one object, as an element of identity/list -o json.",
				"Fails if the number is neither allocated nor withheld.",
			},
			Flags: scriptcmd.OutputFlag,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			asJSON, err := scriptcmd.JSONOutput(s)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			n, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("parse identity %q: %w", args[0], err))
			}
			id := identity.Number(n)
			txn := c.DB.ReadTxn()
			ident, _, found := c.Identities.Get(txn, IdentityIndex.Query(id))
			if !found || !ident.Allocated() {
				withheld, previous := c.Allocator.WithheldNumber(id)
				if !withheld {
					return scriptcmd.Result("", fmt.Errorf("identity %d is neither allocated nor withheld", id))
				}
				ident = &Identity{ID: id, Labels: previous}
				ident.setWithheld(true)
			}
			lookups := c.lookups(txn)
			if asJSON {
				return scriptcmd.JSON(c.toJSON(ident, lookups), nil)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "Identity:\t%s\nLabels:\t%s\nReferences:\t%d\nWithheld:\t%t\n",
				ident.ID, ident.Labels, ident.References(), ident.Withheld())
			for _, l := range lookups {
				count, first := l.lookup(ident, maxUsersShown)
				fmt.Fprintf(w, "%s:\t%s\n", title(l.kind), usersText(count, first))
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		})
}
