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
type Out struct {
	cell.Out

	Collectors []prometheus.Collector `group:"metrics-collectors,flatten"`
}

// Collectors are the collectors the cells of a hive contributed, in no
// particular order.
type Collectors struct {
	cell.In

	Collectors []prometheus.Collector `group:"metrics-collectors"`
}
