// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/metrics"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// metricsParams are what the datapath's collectors read. The tables are
// optional, as their series are: a hive without one of them has no
// pressure of its map.
type metricsParams struct {
	cell.In

	Log           *slog.Logger
	DB            *statedb.DB
	Datapath      *Datapath
	Config        Config
	Entries       statedb.Table[*ipcachecell.Entry] `optional:"true"`
	PolicyEntries statedb.Table[*policy.Entry]      `optional:"true"`
}

// newMetrics contributes the datapath's collector to the agent's metrics,
// and the pressure of the ipcache and policy maps.
func newMetrics(p metricsParams) metrics.Out {
	return metrics.Out{
		Collectors:  []prometheus.Collector{newDatapathCollector(p.Datapath, programEvents{p.Datapath}, p.Log)},
		MapPressure: newMapPressure(p),
	}
}

// datapathCollector reports the map reconcilers' write statistics, the
// enforcement program's verdict counters and its lost events.
type datapathCollector struct {
	datapath                   *Datapath
	events                     events.Source
	log                        *slog.Logger
	writes, unchanged, packets *prometheus.Desc

	// Cilium's names (ciliumDropReason).
	drops, forwards, dropBytes, forwardBytes *prometheus.Desc
	// eventsLost: the program's lost monitor events (events.Source.Lost).
	eventsLost *prometheus.Desc
}

var _ prometheus.Collector = (*datapathCollector)(nil)

// reportedMaps are the maps whose writes are reported.
func reportedMaps() []string {
	return []string{bpfmaps.IPCacheName, bpfmaps.PolicyName, bpfmaps.EnforcementName}
}

func newDatapathCollector(d *Datapath, source events.Source, log *slog.Logger) *datapathCollector {
	return &datapathCollector{
		datapath: d, events: source, log: log,
		writes: prometheus.NewDesc(metrics.Prefix+"map_writes_total",
			"Keys written to a pinned BPF map by its reconciler", []string{"map"}, nil),
		unchanged: prometheus.NewDesc(metrics.Prefix+"map_writes_unchanged_total",
			"Writes to a pinned BPF map skipped because the map already held the value (after a restart)",
			[]string{"map"}, nil),
		packets: prometheus.NewDesc(metrics.Prefix+"datapath_packets_total",
			"IP packets the enforcement program passed or dropped on the devices, by direction and verdict, since the pinned counters map was created",
			[]string{"direction", "verdict"}, nil),
		drops: prometheus.NewDesc(metrics.CiliumPrefix+"drop_count_total",
			"Packets the enforcement program dropped, by reason and direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"reason", "direction"}, nil),
		dropBytes: prometheus.NewDesc(metrics.CiliumPrefix+"drop_bytes_total",
			"Bytes (skb->len) of the packets the enforcement program dropped, by reason and direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"reason", "direction"}, nil),
		forwardBytes: prometheus.NewDesc(metrics.CiliumPrefix+"forward_bytes_total",
			"Bytes (skb->len) of the packets the enforcement program passed, by direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"direction"}, nil),
		eventsLost: prometheus.NewDesc(metrics.Prefix+"events_lost_total",
			"Monitor events the enforcement program could not write since it was loaded: refused by its per-CPU rate limit (cause rate_limit) or by a full ring buffer (ring_full); 0 when no program is loaded",
			[]string{"cause"}, nil),
		forwards: prometheus.NewDesc(metrics.CiliumPrefix+"forward_count_total",
			"Packets the enforcement program passed, by direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"direction"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.writes
	ch <- c.unchanged
	ch <- c.packets
	ch <- c.drops
	ch <- c.forwards
	ch <- c.dropBytes
	ch <- c.forwardBytes
	ch <- c.eventsLost
}

// Collect implements prometheus.Collector. The packet counters are left
// out while the pinned maps are closed (before start, after stop).
func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range reportedMaps() {
		written, unchanged := c.datapath.MapWrites(name)
		ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(written), name)
		ch <- prometheus.MustNewConstMetric(c.unchanged, prometheus.CounterValue, float64(unchanged), name)
	}
	rateLimited, ringFull, err := uint64(0), uint64(0), events.ErrNoProgram
	if c.events != nil {
		rateLimited, ringFull, err = c.events.Lost()
	}
	if err == nil || errors.Is(err, events.ErrNoProgram) {
		ch <- prometheus.MustNewConstMetric(c.eventsLost, prometheus.CounterValue, float64(rateLimited), "rate_limit")
		ch <- prometheus.MustNewConstMetric(c.eventsLost, prometheus.CounterValue, float64(ringFull), "ring_full")
	} else {
		c.log.Debug("Lost events left out of metrics", "error", err)
	}
	counters, err := c.datapath.Counters()
	if err != nil {
		c.log.Debug("Datapath counters left out of metrics", "error", err)
		return
	}
	for _, v := range []struct {
		direction, verdict string
		packets, bytes     uint64
	}{
		{"ingress", "allowed", counters.IngressAllowed, counters.IngressAllowedBytes},
		{"ingress", "dropped", counters.IngressDropped, counters.IngressDroppedBytes},
		{"egress", "allowed", counters.EgressAllowed, counters.EgressAllowedBytes},
		{"egress", "dropped", counters.EgressDropped, counters.EgressDroppedBytes},
	} {
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(v.packets), v.direction, v.verdict)
		if v.verdict == "allowed" {
			ch <- prometheus.MustNewConstMetric(c.forwards, prometheus.CounterValue, float64(v.packets), ciliumDirection(v.direction))
			ch <- prometheus.MustNewConstMetric(c.forwardBytes, prometheus.CounterValue, float64(v.bytes), ciliumDirection(v.direction))
		}
	}
	for _, d := range counters.Drops {
		reason, direction := ciliumDropReason(d.Reason), ciliumDirection(d.Direction.String())
		ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(d.Packets), reason, direction)
		ch <- prometheus.MustNewConstMetric(c.dropBytes, prometheus.CounterValue, float64(d.Bytes), reason, direction)
	}
}

// Series a Cilium user looks for (metrics.CiliumPrefix), from what this
// agent has: the program counts packets and bytes per direction, for
// allowed packets and for each drop reason, which Cilium's reason strings
// name.
//
// ciliumDropReason is Cilium's reason string for a drop reason of the
// program: "Policy denied" for a packet no policy allows, "Invalid packet"
// (Cilium's DROP_INVALID) for a malformed IP header, "Policy denied by
// denylist" (Cilium's DROP_POLICY_DENY) for a packet a deny entry matches,
// "Unsupported L2 protocol" for a VLAN tag in the packet, "Invalid IPv6
// extension header" for a chain past the program's bound; a fragment the
// program cannot place has no Cilium counterpart and keeps its own name.
func ciliumDropReason(r bpfmaps.Reason) string {
	switch r {
	case bpfmaps.ReasonNoPolicy:
		return "Policy denied"
	case bpfmaps.ReasonMalformed:
		return "Invalid packet"
	case bpfmaps.ReasonPolicyDeny:
		return "Policy denied by denylist"
	case bpfmaps.ReasonVLANTagged:
		return "Unsupported L2 protocol"
	case bpfmaps.ReasonExtHeaders:
		return "Invalid IPv6 extension header"
	case bpfmaps.ReasonSpoofedSource:
		return "Invalid source ip"
	}
	return r.String()
}

// ciliumDirection is Cilium's spelling of a direction label.
func ciliumDirection(direction string) string {
	if direction == "ingress" {
		return "INGRESS"
	}
	return "EGRESS"
}

// newMapPressure returns the fill of the ipcache and policy maps: the rows
// of their desired tables that the writers have written (status Done), the
// entries in the maps as the agent knows them, without reading the
// kernel's maps. Each walks its table in a read transaction, as the
// ipcache cell's collector does, when the table or the writer's progress
// changed since the last walk, at most as often as metrics.Walked allows.
func newMapPressure(p metricsParams) []metrics.MapPressure {
	var out []metrics.MapPressure
	if p.Entries != nil && p.Config.IPCacheMapMaxEntries > 0 {
		var written metrics.Walked[ipcacheProgress, int]
		out = append(out, metrics.MapPressure{Map: bpfmaps.IPCacheName, Fill: func() (float64, bool) {
			txn := p.DB.ReadTxn()
			n := written.Get(p.Datapath.ipcacheProgress(p.Entries.Revision(txn)), func() int {
				n := 0
				for _, rev := range p.Entries.All(txn) {
					if kind, _ := p.Datapath.IPCacheStatus(rev); kind == reconciler.StatusKindDone {
						n++
					}
				}
				return n
			})
			return float64(n) / float64(p.Config.IPCacheMapMaxEntries), true
		}})
	}
	if p.PolicyEntries != nil && p.Config.PolicyMapMaxEntries > 0 {
		// The policy map's writer keeps its status in the rows: the
		// table's revision is the key.
		var written metrics.Walked[statedb.Revision, int]
		out = append(out, metrics.MapPressure{Map: bpfmaps.PolicyName, Fill: func() (float64, bool) {
			txn := p.DB.ReadTxn()
			n := written.Get(p.PolicyEntries.Revision(txn), func() int {
				n := 0
				for e := range p.PolicyEntries.All(txn) {
					if e.Status.Kind == reconciler.StatusKindDone {
						n++
					}
				}
				return n
			})
			return float64(n) / float64(p.Config.PolicyMapMaxEntries), true
		}})
	}
	return out
}

// ipcacheProgress is what the ipcache map's fill depends on: the `ipcache`
// table's revision, and how far its writer got (see ipcacheWriter.status).
type ipcacheProgress struct {
	table, attempted statedb.Revision
	failing          int64
}

// ipcacheProgress reads the writer's progress after the table's revision
// of the snapshot a walk reads: the walk then sees at least that progress.
func (d *Datapath) ipcacheProgress(table statedb.Revision) ipcacheProgress {
	if d.ipcacheWriter == nil {
		return ipcacheProgress{table: table}
	}
	return ipcacheProgress{table: table, attempted: d.ipcacheWriter.attempted.Load(),
		failing: d.ipcacheWriter.numFailing.Load()}
}
