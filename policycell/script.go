package policycell

import (
	"fmt"
	"net/netip"
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
	identities statedb.Table[*identitycell.Identity]) map[string]script.Cmd {
	return map[string]script.Cmd{
		"policy/list":    listCommand(db, l, policies),
		"policy/explain": explainCommand(db, entries, enforcement, ipcache, identities),
	}
}

// listCommand shows each policy file: its policies in force and, if its
// current content is rejected, why.
func listCommand(db *statedb.DB, l *loader, policies statedb.Table[*Policy]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "List the policy files, their policies in force and their errors",
			Detail: []string{
				"A rejected file keeps the policies it had in force before;",
				"its error follows on an indented line.",
				"Fails if the policy directory cannot be read.",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 0 {
				return nil, script.ErrUsage
			}
			if l.dir == "" {
				return scriptcmd.Result("No policy directory (--policy-dir is empty)\n", nil)
			}
			status, err := l.Status()
			txn := db.ReadTxn()
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "File\tStatus\tPolicies\n")
			for _, f := range status {
				state := "in force"
				if f.Error != nil {
					state = "rejected"
				}
				var names []string
				for _, name := range f.Policies {
					if p, _, found := policies.Get(txn, PolicyNameIndex.Query(name)); found {
						name = fmt.Sprintf("%s:%d", name, p.Line)
					}
					names = append(names, name)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", f.File, state, strings.Join(names, " "))
				if f.Error != nil {
					fmt.Fprintf(w, "  %s\n", f.Error)
				}
			}
			w.Flush()
			return scriptcmd.Result(out.String(), err)
		},
	)
}

// explainCommand says whether the policies allow traffic of an address in
// a direction, and why.
func explainCommand(db *statedb.DB, entries statedb.Table[*PolicyEntry], enforcement statedb.Table[*Enforcement],
	ipcache statedb.Table[*ipcachecell.Entry], identities statedb.Table[*identitycell.Identity]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Explain the desired verdict for traffic with an address",
			Args:    "address ingress|egress [TCP/port|UDP/port]",
			Detail: []string{
				"The address is the peer: the source for ingress, the destination",
				"for egress. Its identity is that of the longest ipcache prefix",
				"containing it, or world. The datapath looks up the exact",
				"(identity, direction, protocol, port), then (identity, direction,",
				"any, any). Without a port, the verdict is for other protocols",
				"(ICMP): only an entry for any protocol allows them.",
				"This is the desired state; the maps follow it once reconciled.",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 2 || len(args) > 3 {
				return nil, script.ErrUsage
			}
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("address %q: %w", args[0], err))
			}
			dir, err := ParseDirection(args[1])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			var exact PolicyKey
			if len(args) == 3 {
				if exact, err = parsePortProtocol(args[2]); err != nil {
					return scriptcmd.Result("", err)
				}
			}
			return scriptcmd.Result(explain(db.ReadTxn(), entries, enforcement, ipcache, identities, addr, dir, exact), nil)
		},
	)
}

// parsePortProtocol parses "TCP/443" into a key's protocol and port.
func parsePortProtocol(s string) (PolicyKey, error) {
	name, portText, ok := strings.Cut(s, "/")
	protocol, err := ParseProtocol(name)
	if !ok || err != nil || protocol != ProtocolTCP && protocol != ProtocolUDP {
		return PolicyKey{}, fmt.Errorf("%q: want TCP/port or UDP/port", s)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return PolicyKey{}, fmt.Errorf("%q: port must be in 1..65535", s)
	}
	return PolicyKey{Protocol: protocol, Port: uint16(port)}, nil
}

func explain(txn statedb.ReadTxn, entries statedb.Table[*PolicyEntry], enforcement statedb.Table[*Enforcement],
	ipcache statedb.Table[*ipcachecell.Entry], identities statedb.Table[*identitycell.Identity], addr netip.Addr, dir Direction, exact PolicyKey) string {
	var out strings.Builder
	id := identitycell.IdentityWorld
	if entry, found := ipcachecell.LookupAddress(txn, ipcache, addr); found {
		id = entry.Identity
		var lbls labels.Labels
		if identity, _, found := identities.Get(txn, identitycell.IdentityIndex.Query(id)); found && !entry.Explicit {
			lbls = identity.Labels
		}
		fmt.Fprintf(&out, "Identity: %s (ipcache prefix %s, labels %s)\n", id, entry.Prefix, lbls)
		if status := entry.GetStatus(); status.Kind == reconciler.StatusKindError {
			// Held or failed: the datapath still has what the map had.
			fmt.Fprintf(&out, "Datapath: the ipcache map does not have this entry yet, it keeps the prefix's previous value (%s)\n", status)
		}
	} else {
		fmt.Fprintf(&out, "Identity: %s (world: no ipcache prefix contains %s)\n", id, addr)
	}
	row, _, found := enforcement.Get(txn, EnforcementDirectionIndex.Query(dir))
	if !found || !row.Enforced {
		fmt.Fprintf(&out, "Verdict: allow (%s is not enforced: no policy has %s rules)\n", dir, dir)
		return out.String()
	}
	fmt.Fprintf(&out, "Entries (%s enforced):\n", dir)
	prefix := PolicyKey{Identity: id, Direction: dir}.key()[:5]
	for e := range entries.Prefix(txn, PolicyKeyIndex.QueryFromKey(prefix)) {
		port := "any"
		if e.Key.Port != 0 {
			port = strconv.Itoa(int(e.Key.Port))
		}
		fmt.Fprintf(&out, "  %s/%s %s: %s\n", e.Key.Protocol, port, e.Verdict, strings.Join(e.Policies, ", "))
	}
	lookups := []PolicyKey{{Identity: id, Direction: dir}}
	if exact.Port != 0 {
		exact.Identity, exact.Direction = id, dir
		lookups = []PolicyKey{exact, lookups[0]}
	}
	for _, k := range lookups {
		if e, _, found := entries.Get(txn, PolicyKeyIndex.Query(k)); found {
			fmt.Fprintf(&out, "Verdict: allow (entry %s of %s)\n", k, strings.Join(e.Policies, ", "))
			return out.String()
		}
	}
	fmt.Fprintf(&out, "Verdict: drop (no entry allows it)\n")
	return out.String()
}
