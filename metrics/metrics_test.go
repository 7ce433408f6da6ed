// SPDX-License-Identifier: Apache-2.0

package metrics_test

import (
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// TestCollectorsGroup: what the cells contribute, one collector or more or
// none, is what Collectors holds.
func TestCollectorsGroup(t *testing.T) {
	a := prometheus.NewGauge(prometheus.GaugeOpts{Name: metrics.Prefix + "a", Help: "A"})
	b := prometheus.NewGauge(prometheus.GaugeOpts{Name: metrics.Prefix + "b", Help: "B"})
	c := prometheus.NewGauge(prometheus.GaugeOpts{Name: metrics.Prefix + "c", Help: "C"})
	var got []prometheus.Collector
	h := hive.New(
		cell.Module("one", "One collector", cell.Provide(func() metrics.Out {
			return metrics.Out{Collectors: []prometheus.Collector{a}}
		})),
		cell.Module("two", "Two collectors", cell.Provide(func() metrics.Out {
			return metrics.Out{Collectors: []prometheus.Collector{b, c}}
		})),
		cell.Module("none", "No collector", cell.Provide(func() metrics.Out { return metrics.Out{} })),
		cell.Invoke(func(cs metrics.Collectors) { got = cs.Collectors }),
	)
	require.NoError(t, h.Populate(hivetest.Logger(t)))
	require.ElementsMatch(t, []prometheus.Collector{a, b, c}, got)
}

// TestMapPressureGroup: the map pressure sources the cells contribute, as
// many as they return, are what Collectors holds.
func TestMapPressureGroup(t *testing.T) {
	fill := func() (float64, bool) { return 0.5, true }
	var got []string
	h := hive.New(
		cell.Module("one", "One map", cell.Provide(func() metrics.Out {
			return metrics.Out{MapPressure: []metrics.MapPressure{{Map: "a", Fill: fill}}}
		})),
		cell.Module("two", "Two maps", cell.Provide(func() metrics.Out {
			return metrics.Out{MapPressure: []metrics.MapPressure{{Map: "b", Fill: fill}, {Map: "c", Fill: fill}}}
		})),
		cell.Module("none", "No map", cell.Provide(func() metrics.Out { return metrics.Out{} })),
		cell.Invoke(func(cs metrics.Collectors) {
			for _, m := range cs.MapPressure {
				got = append(got, m.Map)
			}
		}),
	)
	require.NoError(t, h.Populate(hivetest.Logger(t)))
	require.ElementsMatch(t, []string{"a", "b", "c"}, got)
}
