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
	Kind       string               `json:"kind"`
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
	out := identityJSON{Identity: ident.ID, Kind: Kind(ident.ID), Labels: labelList(ident.Labels), References: ident.References(),
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
			Summary: "List the reserved identities and the allocated ones (local and label) with their references and users",
			Detail: []string{
				"The reserved identities (1 host to 8 ingress, 2 world) come",
				"first, as in cilium-dbg identity list: their label is",
				"reserved:<entity>, they have no references (\"-\") and no",
				"users here. Users are contributed by the cells that know",
				"them (the ipcache's prefixes and the resources that own",
				"them); each kind shows its first few and how many more.",
				"-o json: an array of objects (identity, kind: reserved,",
				"local or label, labels, references, withheld, users:",
				"{kind: {count, first}}).",
			},
		},
		func(s *script.State, asJSON bool) (script.WaitFunc, error) {
			txn := c.DB.ReadTxn()
			lookups := c.lookups(txn)
			if asJSON {
				rows := []identityJSON{}
				for _, ident := range reservedIdentities() {
					rows = append(rows, c.toJSON(ident, lookups))
				}
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
			for _, ident := range reservedIdentities() {
				fmt.Fprintf(w, "%s\t-\t\t", ident.ID)
				for _, l := range lookups {
					fmt.Fprintf(w, "%s\t", usersText(l.lookup(ident, maxUsersShown)))
				}
				fmt.Fprintln(w, ident.Labels)
			}
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
				"A number withheld and not allocated shows with 0 references",
				"(and, for a label identity kept for its previous label set,",
				"those labels). A reserved identity (1 to 8) shows with its",
				"reserved:<entity> label. -o json: one object, as an element",
				"of identity/list -o json. Fails if the number is neither",
				"reserved, allocated nor withheld; 0 is no identity.",
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
			if id == identity.Unknown {
				return scriptcmd.Result("", ErrNoIdentity)
			}
			txn := c.DB.ReadTxn()
			ident, _, found := c.Identities.Get(txn, IdentityIndex.Query(id))
			if reserved, ok := ReservedIdentity(id); ok {
				ident, found = reserved, true
			}
			if !found || !ident.Allocated() && !ident.Reserved() {
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
			fmt.Fprintf(w, "Identity:\t%s\nKind:\t%s\nLabels:\t%s\n", ident.ID, Kind(ident.ID), ident.Labels)
			if ident.Reserved() {
				fmt.Fprintf(w, "References:\t-\n")
			} else {
				fmt.Fprintf(w, "References:\t%d\nWithheld:\t%t\n", ident.References(), ident.Withheld())
			}
			for _, l := range lookups {
				count, first := l.lookup(ident, maxUsersShown)
				fmt.Fprintf(w, "%s:\t%s\n", title(l.kind), usersText(count, first))
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		})
}

// Kind names the kind of an identity number: "reserved" (1 to 8),
// "local" (CIDR identities, the local scope), "label" (endpoints'
// identities, the cluster range), or "" for another number.
func Kind(id identity.Number) string {
	switch {
	case id.IsLocal():
		return "local"
	case id.IsCluster():
		return "label"
	}
	if _, ok := id.ReservedEntity(); ok {
		return "reserved"
	}
	return ""
}

// ReservedIdentity returns the row of a reserved identity, as the shell
// shows it: its reserved:<entity> label, no references (reserved
// identities are not allocated). False for any other number, 0 included.
func ReservedIdentity(id identity.Number) (*Identity, bool) {
	entity, ok := id.ReservedEntity()
	if !ok {
		return nil, false
	}
	l, err := labels.New(entity.ReservedLabel())
	if err != nil {
		panic(fmt.Sprintf("reserved label of %s: %v", entity, err)) // a constant
	}
	return &Identity{ID: id, Labels: l}, true
}

// Reserved reports whether the row is a reserved identity's
// ([ReservedIdentity]).
func (i *Identity) Reserved() bool {
	_, ok := i.ID.ReservedEntity()
	return ok
}

// reservedIdentities returns the rows of the reserved identities, in
// order.
func reservedIdentities() []*Identity {
	var rows []*Identity
	for _, id := range identity.ReservedNumbers() {
		row, _ := ReservedIdentity(id)
		rows = append(rows, row)
	}
	return rows
}
