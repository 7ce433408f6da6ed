// SPDX-License-Identifier: Apache-2.0

// Package metrics is how a cell contributes to the agent's Prometheus
// metrics: a constructor returns an [Out] holding its collectors, which
// join a hive value group, and the metrics cell registers whatever the
// group holds ([Collectors]) and serves it. A cell thus describes its own
// state next to it, and the metrics cell knows no other cell.
//
// Owns: the names of the value group and the prefixes of the agent's
// metric names. Reads and writes: nothing.
package metrics
