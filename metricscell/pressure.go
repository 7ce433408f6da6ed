// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// mapPressureCollector reports cilium_bpf_map_pressure: one series per BPF
// map a cell contributed (metrics.MapPressure). The metric is the metrics
// cell's because its series come from several cells, and a registry takes
// one collector per metric.
type mapPressureCollector struct {
	maps     []metrics.MapPressure
	pressure *prometheus.Desc
}

var _ prometheus.Collector = (*mapPressureCollector)(nil)

// newMapPressureCollector returns the collector of the maps' fill.
//
// Possible errors: a map without a name or a Fill, a map contributed
// twice.
func newMapPressureCollector(maps []metrics.MapPressure) (*mapPressureCollector, error) {
	seen := map[string]bool{}
	for _, m := range maps {
		if m.Map == "" || m.Fill == nil {
			return nil, fmt.Errorf("map pressure %q: a map pressure needs a map name and a Fill", m.Map)
		}
		if seen[m.Map] {
			return nil, fmt.Errorf("map pressure %q contributed twice", m.Map)
		}
		seen[m.Map] = true
	}
	return &mapPressureCollector{
		maps: maps,
		pressure: prometheus.NewDesc(metrics.CiliumPrefix+"bpf_map_pressure",
			"Fill of a BPF map: entries over max entries (ipcache and policy: the entries the agent has written; conntrack: the live entries of the last collection pass)",
			[]string{"map_name"}, nil),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *mapPressureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.pressure }

// Collect implements prometheus.Collector.
func (c *mapPressureCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.maps {
		if fill, ok := m.Fill(); ok {
			ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue, fill, m.Map)
		}
	}
}
