// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// TestMapPressure: the maps that two cells contribute are the series of
// one metric, and a map whose fill is unknown is left out of the scrape.
func TestMapPressure(t *testing.T) {
	registry := prometheus.NewRegistry()
	require.NoError(t, registerCollectors(registry, metrics.Collectors{MapPressure: []metrics.MapPressure{
		{Map: "a", Fill: func() (float64, bool) { return 0.25, true }},
		{Map: "b", Fill: func() (float64, bool) { return 0, false }},
		{Map: "c", Fill: func() (float64, bool) { return 1, true }},
	}}))
	families, err := registry.Gather()
	require.NoError(t, err)
	require.Len(t, families, 1)
	f := families[0]
	require.Equal(t, "cilium_bpf_map_pressure", f.GetName())
	require.Equal(t, "Fill of a BPF map: entries over max entries (ipcache and policy: the entries the agent has written; conntrack: the live entries of the last collection pass)", f.GetHelp())
	got := map[string]float64{}
	for _, m := range f.GetMetric() {
		require.Len(t, m.GetLabel(), 1)
		require.Equal(t, "map_name", m.GetLabel()[0].GetName())
		got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
	}
	require.Equal(t, map[string]float64{"a": 0.25, "c": 1}, got)
}

// TestMapPressureNone: without a map, the metric is not registered.
func TestMapPressureNone(t *testing.T) {
	registry := prometheus.NewRegistry()
	require.NoError(t, registerCollectors(registry, metrics.Collectors{}))
	families, err := registry.Gather()
	require.NoError(t, err)
	require.Empty(t, families)
}

// TestMapPressureInvalid: a map contributed twice, or without a name or a
// Fill, fails the registration.
func TestMapPressureInvalid(t *testing.T) {
	fill := func() (float64, bool) { return 0, true }
	for name, maps := range map[string][]metrics.MapPressure{
		"twice":   {{Map: "a", Fill: fill}, {Map: "a", Fill: fill}},
		"no name": {{Fill: fill}},
		"no fill": {{Map: "a"}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Error(t, registerCollectors(prometheus.NewRegistry(), metrics.Collectors{MapPressure: maps}))
		})
	}
}
