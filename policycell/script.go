// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

func newScriptCommands(db *statedb.DB, l *loader, policies statedb.Table[*Policy], entries statedb.Table[*PolicyEntry],
	enforcement statedb.Table[*Enforcement], ipcache statedb.Table[*ipcachecell.Entry],
	identities statedb.Table[*identitycell.Identity], datapath DatapathMaps) map[string]script.Cmd {
	return map[string]script.Cmd{
		"policy/list":    listCommand(db, l, policies, entries),
		"policy/explain": explainCommand(db, entries, enforcement, ipcache, identities, datapath),
	}
}

// listCommand shows each policy file: its policies in force, how many of
// their entries the datapath could not write and why, and, if its current
// content is rejected, why.
func listCommand(db *statedb.DB, l *loader, policies statedb.Table[*Policy], entries statedb.Table[*PolicyEntry]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "List the policy files, their policies in force and their errors",
			Detail: []string{
				"A rejected file keeps the policies it had in force before;",
				"its error follows on an indented line.",
				"A file whose policies have entries the datapath could not write",
				"to the policy map (a full map) says how many in its status, and",
				"why on an indented line: the traffic those entries allow is",
				"dropped until they are written (they are retried).",
				"Fails if the policy directory cannot be read.",
				"-o json: an array of objects, one per file (file, status: in force",
				"or rejected, policies with name and line, notWritten: entries not",
				"in the policy map, notWrittenErrors, error); empty without a",
				"policy directory.",
			},
			Flags: scriptcmd.OutputFlag,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 0 {
				return nil, script.ErrUsage
			}
			asJSON, err := scriptcmd.JSONOutput(s)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			if l.dir == "" {
				if asJSON {
					return scriptcmd.JSON([]fileJSON{}, nil)
				}
				return scriptcmd.Result("No policy directory (--policy-dir is empty)\n", nil)
			}
			status, err := l.Status()
			txn := db.ReadTxn()
			notWritten := notWrittenByFile(status, entries.All(txn))
			if asJSON {
				return scriptcmd.JSON(filesJSON(txn, policies, status, notWritten), err)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "File\tStatus\tPolicies\n")
			for i, f := range status {
				state := "in force"
				if f.Error != nil {
					state = "rejected"
				}
				n := notWritten[i]
				if n.entries > 0 {
					state += ", " + n.count()
				}
				var names []string
				for _, name := range f.Policies {
					if p, _, found := policies.Get(txn, PolicyNameIndex.Query(name)); found {
						name = fmt.Sprintf("%s:%d", name, p.Line)
					}
					names = append(names, name)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", f.File, state, strings.Join(names, " "))
				if n.entries > 0 {
					fmt.Fprintf(w, "  %s\n", n)
				}
				if f.Error != nil {
					fmt.Fprintf(w, "  %s\n", f.Error)
				}
			}
			w.Flush()
			return scriptcmd.Result(out.String(), err)
		},
	)
}

// fileJSON is a file of policy/list -o json.
type fileJSON struct {
	File string `json:"file"`
	// Status is "in force" or "rejected" (its policies in force are
	// those of an earlier content).
	Status   string           `json:"status"`
	Policies []policyLineJSON `json:"policies"`
	// NotWritten counts the entries of its policies that the datapath
	// could not write to the policy map; NotWrittenErrors say why.
	NotWritten       int      `json:"notWritten"`
	NotWrittenErrors []string `json:"notWrittenErrors"`
	Error            string   `json:"error"`
}

type policyLineJSON struct {
	Name string `json:"name"`
	// Line is the line of its name in the file; 0 if not known.
	Line int `json:"line"`
}

func filesJSON(txn statedb.ReadTxn, policies statedb.Table[*Policy], status []fileStatus, notWritten []unwrittenEntries) []fileJSON {
	out := make([]fileJSON, 0, len(status))
	for i, f := range status {
		row := fileJSON{File: f.File, Status: "in force", Policies: []policyLineJSON{},
			NotWritten: notWritten[i].entries, NotWrittenErrors: []string{}}
		if f.Error != nil {
			row.Status, row.Error = "rejected", f.Error.Error()
		}
		if notWritten[i].errors != nil {
			row.NotWrittenErrors = notWritten[i].errors
		}
		for _, name := range f.Policies {
			p := policyLineJSON{Name: name}
			if policy, _, found := policies.Get(txn, PolicyNameIndex.Query(name)); found {
				p.Line = policy.Line
			}
			row.Policies = append(row.Policies, p)
		}
		out = append(out, row)
	}
	return out
}

// unwrittenEntries are the entries of a file's policies that the datapath
// could not write to the policy map, with the distinct errors why.
type unwrittenEntries struct {
	entries int
	errors  []string // sorted
}

// maxListedErrors is how many distinct errors policy/list shows per file:
// a full map gives every entry the same one, other failures may differ.
const maxListedErrors = 3

// count is what the file's status column says.
func (u unwrittenEntries) count() string {
	if u.entries == 1 {
		return "1 policy entry not in the policy map"
	}
	return fmt.Sprintf("%d policy entries not in the policy map", u.entries)
}

// String is the line below the file's: the count and why.
func (u unwrittenEntries) String() string {
	errs := u.errors
	more := ""
	if len(errs) > maxListedErrors {
		more = fmt.Sprintf("; %d more errors", len(errs)-maxListedErrors)
		errs = errs[:maxListedErrors]
	}
	return fmt.Sprintf("%s (%s%s)", u.count(), strings.Join(errs, "; "), more)
}

// notWrittenByFile counts, for each file (by its index in status), the
// `policy` rows of its policies in force whose reconciliation status is
// Error: the datapath's writer failed to put them into the policy map
// (statedb's reconciler sets Error only on a failed write, and the policy
// writer never holds a key back). A row that several of a file's policies
// share counts once for the file.
func notWrittenByFile(status []fileStatus, rows iter.Seq2[*PolicyEntry, statedb.Revision]) []unwrittenEntries {
	fileOf := map[string]int{}
	for i, f := range status {
		for _, name := range f.Policies {
			fileOf[name] = i
		}
	}
	out := make([]unwrittenEntries, len(status))
	errs := make([]map[string]struct{}, len(status))
	seen := map[int]struct{}{}
	for e := range rows {
		if e.Status.Kind != reconciler.StatusKindError {
			continue
		}
		clear(seen)
		for _, name := range e.Policies {
			i, ok := fileOf[name]
			if _, dup := seen[i]; !ok || dup {
				continue
			}
			seen[i] = struct{}{}
			out[i].entries++
			if errs[i] == nil {
				errs[i] = map[string]struct{}{}
			}
			errs[i][e.Status.GetError()] = struct{}{}
		}
	}
	for i := range out {
		if errs[i] != nil {
			out[i].errors = slices.Sorted(maps.Keys(errs[i]))
		}
	}
	return out
}

// explainCommand says whether the policies allow traffic of an address in
// a direction, and why.
func explainCommand(db *statedb.DB, entries statedb.Table[*PolicyEntry], enforcement statedb.Table[*Enforcement],
	ipcache statedb.Table[*ipcachecell.Entry], identities statedb.Table[*identitycell.Identity], datapath DatapathMaps) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Explain the desired verdict for traffic with an address",
			Args:    "address ingress|egress [TCP/port|UDP/port|SCTP/port]",
			Detail: []string{
				"The address is the peer: the source for ingress, the destination",
				"for egress. Its identity is that of the longest ipcache prefix",
				"containing it, or world. The datapath looks up the exact",
				"(identity, direction, protocol, port), then (identity, direction,",
				"any, any). Without a port, the verdict is for other protocols",
				"(ICMP): only an entry for any protocol allows them.",
				"This is the desired state; the maps follow it once reconciled. An",
				"entry the datapath could not write (a full policy map) allows",
				"nothing. With the datapath, a last line (Maps:) says what the",
				"enforcement program decides from the maps as they are now.",
				"-o json: one object (address, direction, port as TCP/443 or \"\",",
				"identity, prefix: the ipcache prefix or \"\" for world, enforced,",
				"allowed: the desired verdict, explanation: the text's lines).",
			},
			Flags: scriptcmd.OutputFlag,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 2 || len(args) > 3 {
				return nil, script.ErrUsage
			}
			asJSON, err := scriptcmd.JSONOutput(s)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("parse address %q: %w", args[0], err))
			}
			dir, err := ParseDirection(args[1])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			var exact PolicyKey
			if len(args) == 3 {
				if exact, err = parsePortRange(args[2]); err != nil {
					return scriptcmd.Result("", err)
				}
			}
			txn := db.ReadTxn()
			if !asJSON {
				return scriptcmd.Result(explain(txn, entries, enforcement, ipcache, identities, datapath, addr, dir, exact), nil)
			}
			var text strings.Builder
			out := explainJSON{Address: addr.String(), Direction: dir.String(), Identity: uint32(identitycell.IdentityWorld)}
			out.Allowed = explainDesired(&text, txn, entries, enforcement, ipcache, identities, datapath, addr, dir, exact)
			if datapath != nil {
				explainMaps(&text, datapath, addr, dir, exact, out.Allowed)
			}
			out.Explanation = strings.Split(strings.TrimSuffix(text.String(), "\n"), "\n")
			if len(args) == 3 {
				out.Port = args[2]
			}
			if entry, found := ipcachecell.LookupAddress(txn, ipcache, addr); found {
				out.Identity, out.Prefix = uint32(entry.Identity), entry.Prefix.String()
			}
			row, _, found := enforcement.Get(txn, EnforcementDirectionIndex.Query(dir))
			out.Enforced = found && row.Enforced
			return scriptcmd.JSON(out, nil)
		},
	)
}

// explainJSON is policy/explain -o json.
type explainJSON struct {
	Address   string `json:"address"`
	Direction string `json:"direction"`
	Port      string `json:"port"`
	Identity  uint32 `json:"identity"`
	Prefix    string `json:"prefix"`
	Enforced  bool   `json:"enforced"`
	// Allowed is the desired verdict: whether the policies allow it.
	Allowed     bool     `json:"allowed"`
	Explanation []string `json:"explanation"`
}

// parsePortRange parses "TCP/443" (or UDP, SCTP) into a key's protocol and
// port.
func parsePortRange(s string) (PolicyKey, error) {
	name, portText, ok := strings.Cut(s, "/")
	protocol, err := ParseProtocol(name)
	if !ok || err != nil || protocol != ProtocolTCP && protocol != ProtocolUDP && protocol != ProtocolSCTP {
		return PolicyKey{}, fmt.Errorf("%q: want TCP/port, UDP/port or SCTP/port", s)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return PolicyKey{}, fmt.Errorf("%q: port must be in 1..65535", s)
	}
	return PolicyKey{Protocol: protocol, Port: uint16(port)}, nil
}

func explain(txn statedb.ReadTxn, entries statedb.Table[*PolicyEntry], enforcement statedb.Table[*Enforcement],
	ipcache statedb.Table[*ipcachecell.Entry], identities statedb.Table[*identitycell.Identity], datapath DatapathMaps,
	addr netip.Addr, dir Direction, exact PolicyKey) string {
	var out strings.Builder
	desired := explainDesired(&out, txn, entries, enforcement, ipcache, identities, datapath, addr, dir, exact)
	if datapath != nil {
		explainMaps(&out, datapath, addr, dir, exact, desired)
	}
	return out.String()
}

// explainDesired writes what the tables say of the traffic (the identity,
// the direction's enforcement, the entries, the verdict) and returns
// whether the policies allow it. An entry the datapath could not write (its
// status is Error) does not allow: the program finds no such key, unless
// the address's ipcache entry is held too, and the program still finds
// the prefix's previous identity.
func explainDesired(out *strings.Builder, txn statedb.ReadTxn, entries statedb.Table[*PolicyEntry], enforcement statedb.Table[*Enforcement],
	ipcache statedb.Table[*ipcachecell.Entry], identities statedb.Table[*identitycell.Identity], datapath DatapathMaps,
	addr netip.Addr, dir Direction, exact PolicyKey) bool {
	id := identitycell.IdentityWorld
	held := false
	if entry, found := ipcachecell.LookupAddress(txn, ipcache, addr); found {
		id = entry.Identity
		var lbls labels.Labels
		if identity, _, found := identities.Get(txn, identitycell.IdentityIndex.Query(id)); found && !entry.Explicit {
			lbls = identity.Labels
		}
		fmt.Fprintf(out, "Identity: %s (ipcache prefix %s, labels %s)\n", id, entry.Prefix, lbls)
		if status := entry.GetStatus(); status.Kind == reconciler.StatusKindError {
			// Held or failed: the datapath still has what the map had.
			held = true
			fmt.Fprintf(out, "Datapath: the ipcache map does not have this entry yet, it keeps the prefix's previous value (%s)", status)
			if datapath != nil {
				if inMap, found, err := datapath.LookupIdentity(addr); err == nil && found {
					fmt.Fprintf(out, "; the datapath uses identity %s for %s", inMap, addr)
				} else if err == nil {
					fmt.Fprintf(out, "; the datapath uses world (%s) for %s: no ipcache map entry covers it", identitycell.IdentityWorld, addr)
				}
			}
			out.WriteString("\n")
		}
	} else {
		fmt.Fprintf(out, "Identity: %s (world: no ipcache prefix contains %s)\n", id, addr)
	}
	row, _, found := enforcement.Get(txn, EnforcementDirectionIndex.Query(dir))
	if !found || !row.Enforced {
		fmt.Fprintf(out, "Verdict: allow (%s is not enforced: no policy has %s rules)\n", dir, dir)
		return true
	}
	fmt.Fprintf(out, "Entries (%s enforced):\n", dir)
	prefix := PolicyKey{Identity: id, Direction: dir}.key()[:5]
	for e := range entries.Prefix(txn, PolicyKeyIndex.QueryFromKey(prefix)) {
		port := "any"
		if e.Key.Port != 0 {
			port = strconv.Itoa(int(e.Key.Port))
		}
		notWritten := ""
		if e.Status.Kind == reconciler.StatusKindError {
			notWritten = " (not in the policy map: " + e.Status.GetError() + ")"
		}
		fmt.Fprintf(out, "  %s/%s %s: %s%s\n", e.Key.Protocol, port, e.Verdict, strings.Join(e.Policies, ", "), notWritten)
	}
	lookups := []PolicyKey{{Identity: id, Direction: dir}}
	if exact.Port != 0 {
		exact.Identity, exact.Direction = id, dir
		lookups = []PolicyKey{exact, lookups[0]}
	}
	var unwritten []string
	for _, k := range lookups {
		e, _, found := entries.Get(txn, PolicyKeyIndex.Query(k))
		if !found {
			continue
		}
		if e.Status.Kind == reconciler.StatusKindError {
			// The program looks the key up and does not find it.
			unwritten = append(unwritten, fmt.Sprintf("entry %s of %s could not be written to the policy map: %s",
				k, strings.Join(e.Policies, ", "), e.Status.GetError()))
			continue
		}
		fmt.Fprintf(out, "Verdict: allow (entry %s of %s)\n", k, strings.Join(e.Policies, ", "))
		return true
	}
	switch {
	case len(unwritten) > 0 && held:
		fmt.Fprintf(out, "Verdict: the policies allow it, but %s; the datapath still uses the prefix's previous value (Datapath above)\n",
			strings.Join(unwritten, "; "))
		return true
	case len(unwritten) > 0:
		fmt.Fprintf(out, "Verdict: drop (the policies allow it, but %s)\n", strings.Join(unwritten, "; "))
		return true
	}
	fmt.Fprintf(out, "Verdict: drop (no entry allows it)\n")
	return false
}

// explainMaps writes what the enforcement program decides from the maps
// as they are now, in the order it looks them up (enforce.c
// policy_allows), and says so when that is not the desired verdict.
func explainMaps(out *strings.Builder, datapath DatapathMaps, addr netip.Addr, dir Direction, exact PolicyKey, desired bool) {
	verdict := func(allowed bool) string {
		v := "drop"
		if allowed {
			v = "allow"
		}
		if allowed != desired {
			v += ", not what the policies want"
		}
		return v
	}
	id, found, err := datapath.LookupIdentity(addr)
	if err != nil {
		fmt.Fprintf(out, "Maps: cannot be read: %s\n", err)
		return
	}
	if !found {
		id = identitycell.IdentityWorld
	}
	enforced, _, err := datapath.Enforcement(dir)
	if err != nil {
		fmt.Fprintf(out, "Maps: identity %s; cannot read the enforcement map: %s\n", id, err)
		return
	}
	if !enforced {
		fmt.Fprintf(out, "Maps: identity %s, %s not enforced: %s\n", id, dir, verdict(true))
		return
	}
	var lookups []PolicyKey
	if exact.Port != 0 {
		lookups = append(lookups,
			PolicyKey{Identity: id, Direction: dir, Protocol: exact.Protocol, Port: exact.Port},
			PolicyKey{Identity: id, Direction: dir, Protocol: exact.Protocol})
	}
	lookups = append(lookups, PolicyKey{Identity: id, Direction: dir})
	for _, k := range lookups {
		matched, v, found, err := datapath.LookupPolicy(k)
		if err != nil {
			fmt.Fprintf(out, "Maps: identity %s, %s enforced; cannot read the policy map: %s\n", id, dir, err)
			return
		}
		if found && v == VerdictAllow {
			fmt.Fprintf(out, "Maps: identity %s, %s enforced, policy map entry %s: %s\n", id, dir, matched, verdict(true))
			return
		}
	}
	fmt.Fprintf(out, "Maps: identity %s, %s enforced, no policy map entry allows it: %s\n", id, dir, verdict(false))
}
