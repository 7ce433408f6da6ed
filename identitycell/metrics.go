// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// newMetrics contributes the cell's collector to the agent's metrics.
func newMetrics(db *statedb.DB, identities statedb.Table[*Identity], allocator *Allocator) metrics.Out {
	return metrics.Out{Collectors: []prometheus.Collector{newIdentityCollector(db, identities, allocator)}}
}

// identityCollector reports the local identities by state: allocated (the
// rows of the `identities` table) and withheld (numbers that only a
// request naming them gets, as restore holds them; a number can be both),
// which the allocator counts.
type identityCollector struct {
	db         *statedb.DB
	identities statedb.Table[*Identity]
	allocator  *Allocator
	desc       *prometheus.Desc
}

var _ prometheus.Collector = (*identityCollector)(nil)

func newIdentityCollector(db *statedb.DB, identities statedb.Table[*Identity], allocator *Allocator) *identityCollector {
	return &identityCollector{
		db: db, identities: identities, allocator: allocator,
		desc: prometheus.NewDesc(metrics.Prefix+"identities",
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
