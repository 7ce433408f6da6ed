// SPDX-License-Identifier: Apache-2.0

// Package datapathcell makes the kernel match the desired state in statedb,
// and keeps enforcing while the agent is down.
//
// It owns the BPF maps pinned under <bpf-root>/ipcache-agent/ (ipcache,
// policy, enforcement, counters, conntrack, revision, dns-proxy, dns-answers,
// dns-answers-lost: their
// layouts, specs and pins are package bpfmaps'), the writers that write them from the
// desired tables (statedb's reconciler for the policy map, a writer of its
// own for the ipcache map: ipcacheWriter), and the enforcement program
// (bpf/) attached with TCX to every --devices interface through pinned
// links.
//
// At start, before anything writes: bpffs is mounted at --bpf-root if it is
// not one, and the pinned maps are reused, migrated or replaced
// (bpfmaps.EnsureBPFFS, bpfmaps.Open); the pinned ipcache map is read once,
// a block at a time, on a goroutine the start hook starts last. The Datapath
// always provides that read as a bpfmaps.PinnedIPCache, which restore takes
// as the blocks come; the map's writer waits for the read's end, when the
// blocks are one snapshot in address order. Reconcilers prune stale map
// entries only once their table is initialized, so a restart never removes
// an entry that is still wanted.
//
// The three map writers keep a change from dropping what is allowed before
// and after it (make before break: datapathcell/README.md).
// They wait on each other's progress (ordering), and on how far the
// policy selectors have computed ([policy.Progress]).
//
// Enforcement is stateful: replies of connections the policy allowed pass
// (bpf/enforce.c; README.md, Connection tracking); the conntrack cell
// (conntrackcell) sizes the conntrack maps, sets the program's timeouts
// (bpfmaps.ConntrackConfig) and collects the maps the datapath hands it
// (bpfmaps.ConntrackMaps). A connection's entry keeps
// its forward direction's verdict until the next write to the ipcache,
// policy or enforcement map: every such write bumps the pinned revision
// map (revision.go), through the maps Datapath.written hands the writers.
//
// Endpoints: the endpoints map's writer (endpointWriter) writes the
// local endpoints of the `endpoints` table once their subject's policy
// map (subjectPolicies: one per local endpoint identity, in the outer
// policy map) and enforcement entries are in; the Datapath is the
// endpoint.Enforcement whose WaitEnforced the endpoint cell waits on.
//
// Reads: the `ipcache` table (ipcachecell), the `policy` and
// `policy-enforcement` tables (policycell), the `devices` table
// (devicecell) and, when the hive has it, the `endpoints` table: the
// program follows the devices --devices selects and local endpoints'
// interfaces as they come and go (devices.go). Writes: the pinned maps and
// links; reconciliation status in the policy tables. The ipcache map's
// writer keeps the status of the `ipcache` entries itself, by revision
// (Datapath.IPCacheStatus): writing a million entries to the map does not
// rewrite a million rows.
// Metrics: ipcache_agent_map_writes_total,
// ipcache_agent_map_writes_unchanged_total, ipcache_agent_datapath_packets_total,
// ipcache_agent_events_lost_total, Cilium's cilium_drop_count_total,
// cilium_drop_bytes_total, cilium_forward_count_total and
// cilium_forward_bytes_total, contributed to the metrics cell, and the
// ipcache and policy maps' series of cilium_bpf_map_pressure
// (metrics.MapPressure) (metrics.go).
package datapathcell
