// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// newMetrics contributes the cell's collector to the agent's metrics.
func newMetrics(db *statedb.DB, entries statedb.Table[*Entry]) metrics.Out {
	return metrics.Out{Collectors: []prometheus.Collector{newIPCacheCollector(db, entries)}}
}

// ipcacheCollector reports the rows of the desired `ipcache` table by the
// source that won each prefix.
type ipcacheCollector struct {
	db      *statedb.DB
	entries statedb.Table[*Entry]
	desc    *prometheus.Desc
	// bySource is the last walk's count, by the table's revision.
	bySource metrics.Walked[statedb.Revision, map[source.Source]int]
}

var _ prometheus.Collector = (*ipcacheCollector)(nil)

func newIPCacheCollector(db *statedb.DB, entries statedb.Table[*Entry]) *ipcacheCollector {
	return &ipcacheCollector{
		db: db, entries: entries,
		desc: prometheus.NewDesc(metrics.Prefix+"ipcache_entries",
			"Prefixes in the desired ipcache, by the source of the metadata that won",
			[]string{"source"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ipcacheCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector. It walks the table (one read
// transaction, no lock held) when it changed since the last walk, at most
// as often as metrics.Walked allows.
func (c *ipcacheCollector) Collect(ch chan<- prometheus.Metric) {
	txn := c.db.ReadTxn()
	bySource := c.bySource.Get(c.entries.Revision(txn), func() map[source.Source]int {
		n := map[source.Source]int{}
		for e := range c.entries.All(txn) {
			n[e.Source]++
		}
		return n
	})
	for src, n := range bySource {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), src.String())
	}
}
