// SPDX-License-Identifier: Apache-2.0

package metricscell

// The datapath's collectors stay here, in the one file of the metrics cell
// that imports the datapath cell (and the ipcache table it writes from),
// until they move into the datapath's cells, which will contribute them
// through metrics.Out as the other cells do.

import (
	"errors"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/conntrackcell"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/metrics"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// datapathParams are what the datapath's collectors read. Each is
// optional: a hive without the datapath serves the other cells' metrics.
type datapathParams struct {
	cell.In

	Log            *slog.Logger
	DB             *statedb.DB
	Datapath       *datapathcell.Datapath            `optional:"true"`
	DatapathConfig datapathcell.Config               `optional:"true"`
	Entries        statedb.Table[*ipcachecell.Entry] `optional:"true"`
	PolicyEntries  statedb.Table[*policy.Entry]      `optional:"true"`
	Events         events.Source                     `optional:"true"`
	Conntrack      *conntrackcell.Tracker            `optional:"true"`
}

// newDatapathMetrics contributes the datapath's collectors, when the hive
// has a datapath.
func newDatapathMetrics(p datapathParams) metrics.Out {
	if p.Datapath == nil {
		return metrics.Out{}
	}
	return metrics.Out{Collectors: []prometheus.Collector{newDatapathCollector(p.Datapath, p.Events, p.Conntrack, p.Log), newMapPressureCollector(p)}}
}

// datapathCollector reports the map reconcilers' write statistics and the
// enforcement program's verdict counters.
type datapathCollector struct {
	datapath                   *datapathcell.Datapath
	events                     events.Source
	conntrack                  *conntrackcell.Tracker // nil without the conntrack cell
	log                        *slog.Logger
	writes, unchanged, packets *prometheus.Desc

	conntrackEntries, conntrackCollected, conntrackPressure *prometheus.Desc
	openingEntries, openingPressure, conntrackFull          *prometheus.Desc

	// Cilium's names (cilium.go).
	drops, forwards, dropBytes, forwardBytes *prometheus.Desc
	// eventsLost: the program's lost monitor events (events.Source.Lost).
	eventsLost *prometheus.Desc
}

var _ prometheus.Collector = (*datapathCollector)(nil)

// datapathMaps are the maps whose writes are reported.
func datapathMaps() []string {
	return []string{bpfmaps.IPCacheName, bpfmaps.PolicyName, bpfmaps.EnforcementName}
}

func newDatapathCollector(d *datapathcell.Datapath, source events.Source, ct *conntrackcell.Tracker, log *slog.Logger) *datapathCollector {
	return &datapathCollector{
		datapath: d, events: source, conntrack: ct, log: log,
		writes: prometheus.NewDesc(metrics.Prefix+"map_writes_total",
			"Keys written to a pinned BPF map by its reconciler", []string{"map"}, nil),
		unchanged: prometheus.NewDesc(metrics.Prefix+"map_writes_unchanged_total",
			"Writes to a pinned BPF map skipped because the map already held the value (after a restart)",
			[]string{"map"}, nil),
		packets: prometheus.NewDesc(metrics.Prefix+"datapath_packets_total",
			"IP packets the enforcement program passed or dropped on the devices, by direction and verdict, since the pinned counters map was created",
			[]string{"direction", "verdict"}, nil),
		conntrackEntries: prometheus.NewDesc(metrics.Prefix+"conntrack_entries",
			"Live entries of the conntrack map, as counted by the last complete collection pass", nil, nil),
		conntrackCollected: prometheus.NewDesc(metrics.Prefix+"conntrack_collected_total",
			"Expired conntrack entries deleted by the collector since start", nil, nil),
		conntrackPressure: prometheus.NewDesc(metrics.Prefix+"conntrack_map_pressure",
			"Live entries of the conntrack map (established connections) over its max entries; it never evicts: at 1, connections that become established stay in ct_opening (conntrack_full_total)", nil, nil),
		openingEntries: prometheus.NewDesc(metrics.Prefix+"conntrack_opening_entries",
			"Live entries of the ct_opening map (connections not yet established), as counted by the last complete collection pass", nil, nil),
		openingPressure: prometheus.NewDesc(metrics.Prefix+"conntrack_opening_map_pressure",
			"Live ct_opening entries over its max entries; an LRU map, which may evict the least recently used new connections before 1 (the kernel keeps free entries per CPU)", nil, nil),
		conntrackFull: prometheus.NewDesc(metrics.Prefix+"conntrack_full_total",
			"Established connections the program could not move to the full conntrack map since it was loaded (they stay in ct_opening, where new connections can evict them)", nil, nil),
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
	ch <- c.conntrackEntries
	ch <- c.conntrackCollected
	ch <- c.conntrackPressure
	ch <- c.openingEntries
	ch <- c.openingPressure
	ch <- c.conntrackFull
	ch <- c.drops
	ch <- c.forwards
	ch <- c.dropBytes
	ch <- c.forwardBytes
	ch <- c.eventsLost
}

// Collect implements prometheus.Collector. The packet counters are left
// out while the pinned maps are closed (before start, after stop).
func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range datapathMaps() {
		written, unchanged := c.datapath.MapWrites(name)
		ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(written), name)
		ch <- prometheus.MustNewConstMetric(c.unchanged, prometheus.CounterValue, float64(unchanged), name)
	}
	if c.conntrack != nil {
		c.collectConntrack(ch)
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

// mapPressureCollector reports cilium_bpf_map_pressure of the ipcache and
// policy maps (entries written over max entries) and the conntrack map
// (live entries of its collector's last pass).
type mapPressureCollector struct {
	db       *statedb.DB
	ipcache  statedb.Table[*ipcachecell.Entry]
	policy   statedb.Table[*policy.Entry]
	cfg      datapathcell.Config
	datapath *datapathcell.Datapath
	// conntrack is nil without the conntrack cell.
	conntrack *conntrackcell.Tracker

	pressure *prometheus.Desc
}

var _ prometheus.Collector = (*mapPressureCollector)(nil)

func newMapPressureCollector(p datapathParams) *mapPressureCollector {
	return &mapPressureCollector{
		db: p.DB, ipcache: p.Entries, policy: p.PolicyEntries, cfg: p.DatapathConfig,
		datapath: p.Datapath, conntrack: p.Conntrack,
		pressure: prometheus.NewDesc(metrics.CiliumPrefix+"bpf_map_pressure",
			"Fill of a BPF map: entries over max entries (ipcache and policy: the entries the agent has written; conntrack: the live entries of the last collection pass)",
			[]string{"map_name"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *mapPressureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.pressure }

// Collect implements prometheus.Collector. It walks the ipcache and policy
// tables (one read transaction, as the ipcache collector does), counting
// the rows the writers have written (status Done): the entries in the maps
// as the agent knows them, without reading the kernel's maps.
func (c *mapPressureCollector) Collect(ch chan<- prometheus.Metric) {
	txn := c.db.ReadTxn()
	if c.ipcache != nil && c.cfg.IPCacheMapMaxEntries > 0 {
		n := 0
		for _, rev := range c.ipcache.All(txn) {
			if kind, _ := c.datapath.IPCacheStatus(rev); kind == reconciler.StatusKindDone {
				n++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
			float64(n)/float64(c.cfg.IPCacheMapMaxEntries), bpfmaps.IPCacheName)
	}
	if c.policy != nil && c.cfg.PolicyMapMaxEntries > 0 {
		n := 0
		for e := range c.policy.All(txn) {
			if e.Status.Kind == reconciler.StatusKindDone {
				n++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
			float64(n)/float64(c.cfg.PolicyMapMaxEntries), bpfmaps.PolicyName)
	}
	if c.conntrack == nil {
		return
	}
	ct, opening := c.conntrack.Stats()
	if ct.MaxEntries > 0 {
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
			float64(ct.Entries)/float64(ct.MaxEntries), bpfmaps.ConntrackName)
	}
	if opening.MaxEntries > 0 {
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
			float64(opening.Entries)/float64(opening.MaxEntries), bpfmaps.ConntrackOpeningName)
	}
}

// collectConntrack reports the conntrack collector's counts and the
// program's failed moves to a full conntrack map.
func (c *datapathCollector) collectConntrack(ch chan<- prometheus.Metric) {
	ct, opening := c.conntrack.Stats()
	ch <- prometheus.MustNewConstMetric(c.conntrackEntries, prometheus.GaugeValue, float64(ct.Entries))
	ch <- prometheus.MustNewConstMetric(c.conntrackCollected, prometheus.CounterValue, float64(ct.Collected+opening.Collected))
	if ct.MaxEntries > 0 {
		ch <- prometheus.MustNewConstMetric(c.conntrackPressure, prometheus.GaugeValue, float64(ct.Entries)/float64(ct.MaxEntries))
	}
	ch <- prometheus.MustNewConstMetric(c.openingEntries, prometheus.GaugeValue, float64(opening.Entries))
	if opening.MaxEntries > 0 {
		ch <- prometheus.MustNewConstMetric(c.openingPressure, prometheus.GaugeValue, float64(opening.Entries)/float64(opening.MaxEntries))
	}
	if full, err := c.conntrack.Full(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.conntrackFull, prometheus.CounterValue, float64(full))
	}
}
