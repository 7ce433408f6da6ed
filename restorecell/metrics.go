// SPDX-License-Identifier: Apache-2.0

package restorecell

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// newMetrics contributes the cell's collector to the agent's metrics.
func newMetrics(r *Restorer) metrics.Out {
	return metrics.Out{Collectors: []prometheus.Collector{newRestoreCollector(r)}}
}

// restoreCollector reports the restore's progress.
type restoreCollector struct {
	restorer                               *Restorer
	restored, heldOnly, timeLeft, released *prometheus.Desc
	// heldOnlyCount is the last walk's count, by the metadata table's
	// revision: a scrape walks all the prefixes' rows.
	heldOnlyCount metrics.Walked[statedb.Revision, int]
}

var _ prometheus.Collector = (*restoreCollector)(nil)

func newRestoreCollector(r *Restorer) *restoreCollector {
	return &restoreCollector{
		restorer: r,
		restored: prometheus.NewDesc(metrics.Prefix+"restore_restored_prefixes",
			"Prefixes restored from the pinned ipcache map and checkpoint after the start", nil, nil),
		heldOnly: prometheus.NewDesc(metrics.Prefix+"restore_held_only_by_restore_prefixes",
			"Restored prefixes that no other owner has re-asserted yet (0 once released)", nil, nil),
		timeLeft: prometheus.NewDesc(metrics.Prefix+"restore_grace_period_remaining_seconds",
			"Seconds until restored prefixes are released (0 once released)", nil, nil),
		released: prometheus.NewDesc(metrics.Prefix+"restore_released",
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
	st := c.restorer.status(func(txn statedb.ReadTxn) int {
		return c.heldOnlyCount.Get(c.restorer.metadata.Revision(txn), func() int {
			return c.restorer.heldOnlyByRestore(txn)
		})
	})
	released := 0.0
	if st.Released {
		released = 1
	}
	ch <- prometheus.MustNewConstMetric(c.restored, prometheus.GaugeValue, float64(st.Restored))
	ch <- prometheus.MustNewConstMetric(c.heldOnly, prometheus.GaugeValue, float64(st.HeldOnlyByRestore))
	ch <- prometheus.MustNewConstMetric(c.timeLeft, prometheus.GaugeValue, st.TimeLeft.Seconds())
	ch <- prometheus.MustNewConstMetric(c.released, prometheus.GaugeValue, released)
}
