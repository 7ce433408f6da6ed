// SPDX-License-Identifier: Apache-2.0

// Package metrics is how a cell contributes to the agent's Prometheus
// metrics: a constructor returns an [Out] holding its collectors, which
// join a hive value group, and the metrics cell registers whatever the
// group holds ([Collectors]) and serves it. A cell thus describes its own
// state next to it, and the metrics cell knows no other cell.
//
// One metric has series from more than one cell: cilium_bpf_map_pressure,
// one series per BPF map. A cell contributes its maps' fill as
// [MapPressure] (a second value group), and the metrics cell's one
// collector of that metric reads them.
//
// A value a collector counts by walking a table is kept between scrapes
// in a [Walked], which bounds the share of a core that frequent scrapes of
// a large, changing table spend walking it.
//
// Owns: the names of the value groups and the prefixes of the agent's
// metric names. Reads and writes: nothing.
package metrics
