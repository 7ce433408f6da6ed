// SPDX-License-Identifier: Apache-2.0

// Package metricscell serves the agent's Prometheus metrics on
// --prometheus-serve-addr (off by default: nothing listens unless asked).
//
// It owns the metrics registry and the HTTP server, and provides the
// [reconciler.Metrics] that the statedb reconcilers of every cell report
// their rounds, durations and errors to.
//
// Reads, at scrape time and never in the background: the `identities` table
// (allocated numbers) and the allocator's count of withheld ones, the
// `ipcache` table, the restore's
// status, the datapath's map write statistics and its pinned counters map.
// Each of these is optional, so a hive without (say) the datapath still
// serves the rest.
// Writes: nothing but HTTP responses.
//
// [reconciler.Metrics]: https://pkg.go.dev/github.com/cilium/statedb/reconciler#Metrics
package metricscell
