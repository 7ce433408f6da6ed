// SPDX-License-Identifier: Apache-2.0

// Package metricscell serves the agent's Prometheus metrics on
// --prometheus-serve-addr (off by default: nothing listens unless asked).
//
// It owns the metrics registry and the HTTP server, and provides the
// [reconciler.Metrics] that the statedb reconcilers of every cell report
// their rounds, durations and errors to.
//
// It registers the collectors the cells contribute (package metrics, a
// hive value group) and knows no other cell: each cell's collectors sit
// beside it and read its state at scrape time, never in the background, so
// a hive without (say) the restore still serves the rest. It owns the one
// collector of cilium_bpf_map_pressure, whose series come from several
// cells (the maps' metrics.MapPressure, a second value group): a registry
// takes one collector per metric (pressure.go).
// The probes /healthz and /readyz (probes.go) read the health scopes the
// agent's infrastructure hands it ([HealthScopes]) and whether every
// statedb table is initialized.
// Writes: nothing but HTTP responses.
//
// [reconciler.Metrics]: https://pkg.go.dev/github.com/cilium/statedb/reconciler#Metrics
package metricscell
