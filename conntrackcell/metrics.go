// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// newMetrics contributes the cell's collector to the agent's metrics, and
// the pressure of the conntrack and ct_opening maps.
func newMetrics(t *Tracker) metrics.Out {
	return metrics.Out{
		Collectors: []prometheus.Collector{newMetricsCollector(t)},
		MapPressure: []metrics.MapPressure{
			{Map: bpfmaps.ConntrackName, Fill: func() (float64, bool) {
				ct, _ := t.Stats()
				return fill(ct)
			}},
			{Map: bpfmaps.ConntrackOpeningName, Fill: func() (float64, bool) {
				_, opening := t.Stats()
				return fill(opening)
			}},
		},
	}
}

// fill is a map's live entries of the last collection pass over its max
// entries; !ok while the map is not open (before start, after stop).
func fill(s Stats) (float64, bool) {
	if s.MaxEntries == 0 {
		return 0, false
	}
	return float64(s.Entries) / float64(s.MaxEntries), true
}

// metricsCollector reports the collection's counts of the conntrack maps
// and the program's failed moves to a full conntrack map.
type metricsCollector struct {
	tracker *Tracker

	conntrackEntries, conntrackCollected, conntrackPressure *prometheus.Desc
	openingEntries, openingPressure, conntrackFull          *prometheus.Desc
}

var _ prometheus.Collector = (*metricsCollector)(nil)

func newMetricsCollector(t *Tracker) *metricsCollector {
	return &metricsCollector{
		tracker: t,
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
	}
}

// Describe implements prometheus.Collector.
func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conntrackEntries
	ch <- c.conntrackCollected
	ch <- c.conntrackPressure
	ch <- c.openingEntries
	ch <- c.openingPressure
	ch <- c.conntrackFull
}

// Collect implements prometheus.Collector. The counts are the last
// complete collection pass's; conntrack_full_total is left out while no
// program is loaded.
func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	ct, opening := c.tracker.Stats()
	ch <- prometheus.MustNewConstMetric(c.conntrackEntries, prometheus.GaugeValue, float64(ct.Entries))
	ch <- prometheus.MustNewConstMetric(c.conntrackCollected, prometheus.CounterValue, float64(ct.Collected+opening.Collected))
	if pressure, ok := fill(ct); ok {
		ch <- prometheus.MustNewConstMetric(c.conntrackPressure, prometheus.GaugeValue, pressure)
	}
	ch <- prometheus.MustNewConstMetric(c.openingEntries, prometheus.GaugeValue, float64(opening.Entries))
	if pressure, ok := fill(opening); ok {
		ch <- prometheus.MustNewConstMetric(c.openingPressure, prometheus.GaugeValue, pressure)
	}
	if full, err := c.tracker.Full(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.conntrackFull, prometheus.CounterValue, float64(full))
	}
}
