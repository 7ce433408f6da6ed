// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
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
