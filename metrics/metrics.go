// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
)

// Prefix starts the name of every metric of the agent's own.
const Prefix = "ipcache_agent_"

// CiliumPrefix starts the series a Cilium user looks for, under Cilium's
// names and labels.
const CiliumPrefix = "cilium_"

// Out is what a constructor returns to contribute collectors to the
// agent's registry: they join the hive's "metrics-collectors" value group.
// A collector reads current values at scrape time; a nil one is left out.
//
// MapPressure join the "map-pressure" group: the series of one metric,
// cilium_bpf_map_pressure, come from more than one cell, and a registry
// takes one collector per metric, which the metrics cell owns.
type Out struct {
	cell.Out

	Collectors  []prometheus.Collector `group:"metrics-collectors,flatten"`
	MapPressure []MapPressure          `group:"map-pressure,flatten"`
}

// Collectors are the collectors the cells of a hive contributed, and the
// BPF maps whose fill they report, in no particular order.
type Collectors struct {
	cell.In

	Collectors  []prometheus.Collector `group:"metrics-collectors"`
	MapPressure []MapPressure          `group:"map-pressure"`
}

// MapPressure is a BPF map's series of cilium_bpf_map_pressure.
type MapPressure struct {
	// Map is the map's name, the series' map_name label; one per hive.
	Map string
	// Fill returns the map's entries over its max entries, read at scrape
	// time; !ok leaves the series out of this scrape.
	Fill func() (fill float64, ok bool)
}
