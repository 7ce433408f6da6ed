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

// ipcacheStatus is datapath/ipcache-status's document: the `ipcache`
// entries counted by the map writer's status, and those not written.
// Only those are listed: at a million entries a row for each would be a
// large output saying little.
type ipcacheStatus struct {
	Counts  ipcacheStatusCounts  `json:"counts"`
	Entries []ipcacheStatusEntry `json:"entries"`
}

type ipcacheStatusCounts struct {
	Done    int `json:"done"`
	Pending int `json:"pending"`
	Error   int `json:"error"`
}

// ipcacheStatusEntry is an entry not written: status "pending" or
// "error" (with the write's error).
type ipcacheStatusEntry struct {
	Prefix   string `json:"prefix"`
	Identity uint32 `json:"identity"`
	Status   string `json:"status"`
	Error    string `json:"error"`
}

func ipcacheStatusOf(d *Datapath, txn statedb.ReadTxn, entries statedb.Table[*ipcachecell.Entry]) ipcacheStatus {
	status := ipcacheStatus{Entries: []ipcacheStatusEntry{}}
	for e, rev := range entries.All(txn) {
		kind, err := d.IPCacheStatus(rev)
		row := ipcacheStatusEntry{Prefix: e.Prefix().String(), Identity: uint32(e.Identity)}
		switch kind {
		case reconciler.StatusKindDone:
			status.Counts.Done++
			continue
		case reconciler.StatusKindError:
			status.Counts.Error++
			row.Status = "error"
			if err != nil {
				row.Error = err.Error()
			}
		default:
			status.Counts.Pending++
			row.Status = "pending"
		}
		status.Entries = append(status.Entries, row)
	}
	return status
}

// ipcacheStatusText is datapath/ipcache-status's text: the counts, then
// the entries not written, under a header only when there are some.
func ipcacheStatusText(status ipcacheStatus) string {
	var out strings.Builder
	fmt.Fprintf(&out, "done=%d pending=%d error=%d\n", status.Counts.Done, status.Counts.Pending, status.Counts.Error)
	if len(status.Entries) == 0 {
		return out.String()
	}
	w := tabwriter.NewWriter(&out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "Prefix\tIdentity\tStatus")
	for _, e := range status.Entries {
		if e.Status == "error" {
			fmt.Fprintf(w, "%s\t%d\tError: %s\n", e.Prefix, e.Identity, e.Error)
		} else {
			fmt.Fprintf(w, "%s\t%d\tPending\n", e.Prefix, e.Identity)
		}
	}
	w.Flush()
	return out.String()
}

func scriptCommands(d *Datapath, db *statedb.DB, entries statedb.Table[*ipcachecell.Entry]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"datapath/ipcache-status": scriptcmd.Show(
			script.CmdUsage{
				Summary: "Count the ipcache entries the datapath wrote, and list those it did not, with why",
				Detail: []string{
					"The first line counts the `ipcache` table's entries by status: done (in",
					"the ipcache map), pending (not written yet), error (the write failed or",
					"is held for make before break: the map keeps the prefix's previous",
					"value; retried). Then one line per entry that is not done: prefix,",
					"identity, status and error. The entries carry no status of their own",
					"(db/show ipcache shows none): the map's writer keeps it.",
					"-o json: one object, {\"counts\": {\"done\": n, \"pending\": n, \"error\": n},",
					"\"entries\": [{\"prefix\", \"identity\", \"status\": \"pending\" or \"error\",",
					"\"error\"}]}, the entries not done.",
				},
			},
			func(s *script.State, asJSON bool) (script.WaitFunc, error) {
				status := ipcacheStatusOf(d, db.ReadTxn(), entries)
				if asJSON {
					return scriptcmd.JSON(status, nil)
				}
				return scriptcmd.Result(ipcacheStatusText(status), nil)
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
					"\"allowedBytes\": n, \"droppedBytes\": n, \"drops\": {\"no-policy\":",
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
	AllowedBytes uint64 `json:"allowedBytes"`
	DroppedBytes uint64 `json:"droppedBytes"`
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
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "Direction\tAllowed\tDropped\tAllowed bytes\tDropped bytes")
	fmt.Fprintf(w, "ingress\t%d\t%d\t%d\t%d\n", c.IngressAllowed, c.IngressDropped, c.IngressAllowedBytes, c.IngressDroppedBytes)
	fmt.Fprintf(w, "egress\t%d\t%d\t%d\t%d\n", c.EgressAllowed, c.EgressDropped, c.EgressAllowedBytes, c.EgressDroppedBytes)
	w.Flush()
	w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "Direction\tDrop reason\tPackets\tBytes")
	for _, d := range c.Drops {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\n", d.Direction, d.Reason, d.Packets, d.Bytes)
	}
	w.Flush()
	return b.String()
}
