// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/conntrackcell"
	"github.com/ipcache-agent/ipcache-agent/policy"

	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
)

// metricPrefix starts the name of every metric of the agent's own.
const metricPrefix = "ipcache_agent_"

// stateParams are what the state collectors read. Each is optional: a hive
// without a cell (a test, an embedding agent) serves the metrics of the
// cells it has.
type stateParams struct {
	cell.In

	Registry   *prometheus.Registry
	Log        *slog.Logger
	DB         *statedb.DB
	Identities statedb.Table[*identitycell.Identity] `optional:"true"`
	Allocator  *identitycell.Allocator               `optional:"true"`
	Entries    statedb.Table[*ipcachecell.Entry]     `optional:"true"`
	Restorer   *restorecell.Restorer                 `optional:"true"`
	Datapath   *datapathcell.Datapath                `optional:"true"`
	Conntrack  *conntrackcell.Tracker                `optional:"true"`

	PolicyEntries  statedb.Table[*policy.Entry]  `optional:"true"`
	Policies       statedb.Table[*policy.Policy] `optional:"true"`
	PolicyFiles    *policycell.PolicyFiles       `optional:"true"`
	DatapathConfig datapathcell.Config           `optional:"true"`
}

func registerStateCollectors(p stateParams) error {
	var cs []prometheus.Collector
	if p.Identities != nil && p.Allocator != nil {
		cs = append(cs, newIdentityCollector(p.DB, p.Identities, p.Allocator))
	}
	if p.Entries != nil {
		cs = append(cs, newIPCacheCollector(p.DB, p.Entries))
	}
	if p.Restorer != nil {
		cs = append(cs, newRestoreCollector(p.Restorer))
	}
	if p.Datapath != nil {
		cs = append(cs, newDatapathCollector(p.Datapath, p.Conntrack, p.Log), newMapPressureCollector(p))
	}
	for _, c := range cs {
		if err := p.Registry.Register(c); err != nil {
			return fmt.Errorf("register metrics collector: %w", err)
		}
	}
	return nil
}

// identityCollector reports the local identities by state: allocated (the
// rows of the `identities` table) and withheld (numbers that only a
// request naming them gets, as restore holds them; a number can be both),
// which the allocator counts.
type identityCollector struct {
	db         *statedb.DB
	identities statedb.Table[*identitycell.Identity]
	allocator  *identitycell.Allocator
	desc       *prometheus.Desc
}

var _ prometheus.Collector = (*identityCollector)(nil)

func newIdentityCollector(db *statedb.DB, identities statedb.Table[*identitycell.Identity],
	allocator *identitycell.Allocator) *identityCollector {
	return &identityCollector{
		db: db, identities: identities, allocator: allocator,
		desc: prometheus.NewDesc(metricPrefix+"identities",
			"Local identities by state: allocated, or withheld (numbers kept for requests naming them); a number can be both",
			[]string{"state"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *identityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *identityCollector) Collect(ch chan<- prometheus.Metric) {
	allocated := c.identities.NumObjects(c.db.ReadTxn())
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(allocated), "allocated")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.allocator.NumWithheld()), "withheld")
}

// ipcacheCollector reports the rows of the desired `ipcache` table by the
// source that won each prefix.
type ipcacheCollector struct {
	db      *statedb.DB
	entries statedb.Table[*ipcachecell.Entry]
	desc    *prometheus.Desc
}

var _ prometheus.Collector = (*ipcacheCollector)(nil)

func newIPCacheCollector(db *statedb.DB, entries statedb.Table[*ipcachecell.Entry]) *ipcacheCollector {
	return &ipcacheCollector{
		db: db, entries: entries,
		desc: prometheus.NewDesc(metricPrefix+"ipcache_entries",
			"Prefixes in the desired ipcache, by the source of the metadata that won",
			[]string{"source"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ipcacheCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector. It walks the table (one read
// transaction, no lock held), which costs well under a scrape interval even
// at the map's maximum size.
func (c *ipcacheCollector) Collect(ch chan<- prometheus.Metric) {
	bySource := map[string]int{}
	for e := range c.entries.All(c.db.ReadTxn()) {
		bySource[e.Source.String()]++
	}
	for src, n := range bySource {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), src)
	}
}

// restoreCollector reports the restore's progress.
type restoreCollector struct {
	restorer                               *restorecell.Restorer
	restored, heldOnly, timeLeft, released *prometheus.Desc
}

var _ prometheus.Collector = (*restoreCollector)(nil)

func newRestoreCollector(r *restorecell.Restorer) *restoreCollector {
	return &restoreCollector{
		restorer: r,
		restored: prometheus.NewDesc(metricPrefix+"restore_restored_prefixes",
			"Prefixes restored from the pinned ipcache map and checkpoint at start", nil, nil),
		heldOnly: prometheus.NewDesc(metricPrefix+"restore_held_only_by_restore_prefixes",
			"Restored prefixes that no other owner has re-asserted yet (0 once released)", nil, nil),
		timeLeft: prometheus.NewDesc(metricPrefix+"restore_grace_period_remaining_seconds",
			"Seconds until restored prefixes are released (0 once released)", nil, nil),
		released: prometheus.NewDesc(metricPrefix+"restore_released",
			"1 once the grace period has ended and restored prefixes were released, else 0", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *restoreCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.restored
	ch <- c.heldOnly
	ch <- c.timeLeft
	ch <- c.released
}

// Collect implements prometheus.Collector.
func (c *restoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.restorer.Status()
	released := 0.0
	if st.Released {
		released = 1
	}
	ch <- prometheus.MustNewConstMetric(c.restored, prometheus.GaugeValue, float64(st.Restored))
	ch <- prometheus.MustNewConstMetric(c.heldOnly, prometheus.GaugeValue, float64(st.HeldOnlyByRestore))
	ch <- prometheus.MustNewConstMetric(c.timeLeft, prometheus.GaugeValue, st.TimeLeft.Seconds())
	ch <- prometheus.MustNewConstMetric(c.released, prometheus.GaugeValue, released)
}

// datapathCollector reports the map reconcilers' write statistics and the
// enforcement program's verdict counters.
type datapathCollector struct {
	datapath                   *datapathcell.Datapath
	conntrack                  *conntrackcell.Tracker // nil without the conntrack cell
	log                        *slog.Logger
	writes, unchanged, packets *prometheus.Desc

	conntrackEntries, conntrackCollected, conntrackPressure *prometheus.Desc
	openingEntries, openingPressure, conntrackFull          *prometheus.Desc

	// Cilium's names (cilium.go).
	drops, forwards, dropBytes, forwardBytes *prometheus.Desc
	// eventsLost: the program's lost monitor events (datapathcell.Datapath.EventsLost).
	eventsLost *prometheus.Desc
}

var _ prometheus.Collector = (*datapathCollector)(nil)

// datapathMaps are the maps whose writes are reported.
func datapathMaps() []string {
	return []string{bpfmaps.IPCacheName, bpfmaps.PolicyName, bpfmaps.EnforcementName}
}

func newDatapathCollector(d *datapathcell.Datapath, ct *conntrackcell.Tracker, log *slog.Logger) *datapathCollector {
	return &datapathCollector{
		datapath: d, conntrack: ct, log: log,
		writes: prometheus.NewDesc(metricPrefix+"map_writes_total",
			"Keys written to a pinned BPF map by its reconciler", []string{"map"}, nil),
		unchanged: prometheus.NewDesc(metricPrefix+"map_writes_unchanged_total",
			"Writes to a pinned BPF map skipped because the map already held the value (after a restart)",
			[]string{"map"}, nil),
		packets: prometheus.NewDesc(metricPrefix+"datapath_packets_total",
			"IP packets the enforcement program passed or dropped on the devices, by direction and verdict, since the pinned counters map was created",
			[]string{"direction", "verdict"}, nil),
		conntrackEntries: prometheus.NewDesc(metricPrefix+"conntrack_entries",
			"Live entries of the conntrack map, as counted by the last complete collection pass", nil, nil),
		conntrackCollected: prometheus.NewDesc(metricPrefix+"conntrack_collected_total",
			"Expired conntrack entries deleted by the collector since start", nil, nil),
		conntrackPressure: prometheus.NewDesc(metricPrefix+"conntrack_map_pressure",
			"Live entries of the conntrack map (established connections) over its max entries; it never evicts: at 1, connections that become established stay in ct_opening (conntrack_full_total)", nil, nil),
		openingEntries: prometheus.NewDesc(metricPrefix+"conntrack_opening_entries",
			"Live entries of the ct_opening map (connections not yet established), as counted by the last complete collection pass", nil, nil),
		openingPressure: prometheus.NewDesc(metricPrefix+"conntrack_opening_map_pressure",
			"Live ct_opening entries over its max entries; an LRU map, which may evict the least recently used new connections before 1 (the kernel keeps free entries per CPU)", nil, nil),
		conntrackFull: prometheus.NewDesc(metricPrefix+"conntrack_full_total",
			"Established connections the program could not move to the full conntrack map since it was loaded (they stay in ct_opening, where new connections can evict them)", nil, nil),
		drops: prometheus.NewDesc(ciliumPrefix+"drop_count_total",
			"Packets the enforcement program dropped, by reason and direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"reason", "direction"}, nil),
		dropBytes: prometheus.NewDesc(ciliumPrefix+"drop_bytes_total",
			"Bytes (skb->len) of the packets the enforcement program dropped, by reason and direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"reason", "direction"}, nil),
		forwardBytes: prometheus.NewDesc(ciliumPrefix+"forward_bytes_total",
			"Bytes (skb->len) of the packets the enforcement program passed, by direction (INGRESS, EGRESS), since the pinned counters map was created",
			[]string{"direction"}, nil),
		eventsLost: prometheus.NewDesc(metricPrefix+"events_lost_total",
			"Monitor events the enforcement program could not write since it was loaded: refused by its per-CPU rate limit (cause rate_limit) or by a full ring buffer (ring_full); 0 when no program is loaded",
			[]string{"cause"}, nil),
		forwards: prometheus.NewDesc(ciliumPrefix+"forward_count_total",
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
	rateLimited, ringFull, err := c.datapath.EventsLost()
	if err == nil || errors.Is(err, datapathcell.ErrNoProgram) {
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
