// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// ipcacheStatusText is datapath/ipcache-status's output: the counts, then
// the entries not written. Only those are listed: at a million entries a
// line for each would be a large output saying little.
func ipcacheStatusText(d *Datapath, txn statedb.ReadTxn, entries statedb.Table[*ipcachecell.Entry]) string {
	var (
		done, pending, failed int
		out                   strings.Builder
	)
	w := tabwriter.NewWriter(&out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "Prefix\tIdentity\tStatus")
	for e, rev := range entries.All(txn) {
		kind, err := d.IPCacheStatus(rev)
		switch kind {
		case reconciler.StatusKindDone:
			done++
			continue
		case reconciler.StatusKindError:
			failed++
			fmt.Fprintf(w, "%s\t%s\tError: %v\n", e.Prefix, e.Identity, err)
		default:
			pending++
			fmt.Fprintf(w, "%s\t%s\tPending\n", e.Prefix, e.Identity)
		}
	}
	w.Flush()
	return fmt.Sprintf("done=%d pending=%d error=%d\n", done, pending, failed) + out.String()
}

func scriptCommands(d *Datapath, db *statedb.DB, entries statedb.Table[*ipcachecell.Entry]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"datapath/ipcache-status": script.Command(
			script.CmdUsage{
				Summary: "Count the ipcache entries the datapath wrote, and list those it did not, with why",
				Detail: []string{
					"The first line counts the `ipcache` table's entries by status: done (in",
					"the ipcache map), pending (not written yet), error (the write failed or",
					"is held for make before break: the map keeps the prefix's previous",
					"value; retried). Then one line per entry that is not done: prefix,",
					"identity, status and error. The entries carry no status of their own",
					"(db/show ipcache shows none): the map's writer keeps it.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 0 {
					return nil, script.ErrUsage
				}
				return scriptcmd.Result(ipcacheStatusText(d, db.ReadTxn(), entries), nil)
			}),
		"datapath/counters": scriptcmd.Show(
			script.CmdUsage{
				Summary: "Show the enforcement program's allowed and dropped packets and bytes per direction",
				Detail: []string{
					"Counts IP packets on every --devices interface since the counters map",
					"was created (it is pinned: counts survive restarts). A direction that",
					"is not enforced counts everything as allowed. Bytes are skb->len (from",
					"the Ethernet header on). Drops are also shown by reason (no-policy,",
					"malformed-ip-header, policy-deny).",
					"-o json: one object, {\"ingress\": {\"allowed\": n, \"dropped\": n,",
					"\"allowed_bytes\": n, \"dropped_bytes\": n, \"drops\": {\"no-policy\":",
					"{\"packets\": n, \"bytes\": n}, ...}}, \"egress\": {...}}.",
				},
			},
			func(s *script.State, asJSON bool) (script.WaitFunc, error) {
				c, err := d.Counters()
				if err != nil {
					return scriptcmd.Result("", err)
				}
				if asJSON {
					return scriptcmd.JSON(countersJSON(c), nil)
				}
				return scriptcmd.Result(countersText(c), nil)
			}),
	})
}

// verdictCountsJSON is a direction's counts in datapath/counters -o json.
type verdictCountsJSON struct {
	Allowed      uint64 `json:"allowed"`
	Dropped      uint64 `json:"dropped"`
	AllowedBytes uint64 `json:"allowed_bytes"`
	DroppedBytes uint64 `json:"dropped_bytes"`
	// Drops by reason name (bpfmaps.Reason.String).
	Drops map[string]dropCountJSON `json:"drops"`
}

// dropCountJSON is a reason's drops in datapath/counters -o json.
type dropCountJSON struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

func countersJSON(c bpfmaps.Counters) map[string]verdictCountsJSON {
	out := map[string]verdictCountsJSON{
		"ingress": {Allowed: c.IngressAllowed, Dropped: c.IngressDropped,
			AllowedBytes: c.IngressAllowedBytes, DroppedBytes: c.IngressDroppedBytes, Drops: map[string]dropCountJSON{}},
		"egress": {Allowed: c.EgressAllowed, Dropped: c.EgressDropped,
			AllowedBytes: c.EgressAllowedBytes, DroppedBytes: c.EgressDroppedBytes, Drops: map[string]dropCountJSON{}},
	}
	for _, d := range c.Drops {
		out[d.Direction.String()].Drops[d.Reason.String()] = dropCountJSON{Packets: d.Packets, Bytes: d.Bytes}
	}
	return out
}

// countersText is datapath/counters' table: the verdicts, then a line per
// direction and drop reason.
func countersText(c bpfmaps.Counters) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Direction  Allowed  Dropped  Allowed bytes  Dropped bytes\n")
	fmt.Fprintf(&b, "ingress    %d  %d  %d  %d\n", c.IngressAllowed, c.IngressDropped, c.IngressAllowedBytes, c.IngressDroppedBytes)
	fmt.Fprintf(&b, "egress     %d  %d  %d  %d\n", c.EgressAllowed, c.EgressDropped, c.EgressAllowedBytes, c.EgressDroppedBytes)
	fmt.Fprintf(&b, "Direction  Drop reason  Packets  Bytes\n")
	for _, d := range c.Drops {
		fmt.Fprintf(&b, "%-9s  %s  %d  %d\n", d.Direction, d.Reason, d.Packets, d.Bytes)
	}
	return b.String()
}
