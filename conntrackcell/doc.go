// SPDX-License-Identifier: Apache-2.0

// Package conntrackcell owns connection tracking on the agent's side: the
// --conntrack-* flags, the collection of expired entries and the
// conntrack shell commands.
//
// The enforcement program writes the conntrack and ct_opening maps (their
// layout is package bpfmaps'; the datapath's README, Connection tracking,
// says what the program tracks). The datapath opens the pinned maps and
// loads the program over them: it takes the maps' sizes and the program's
// timeouts from this cell as a bpfmaps.ConntrackConfig, and hands back
// the opened maps as a bpfmaps.ConntrackMaps, so that neither cell
// imports the other.
//
// Reads: the conntrack and ct_opening maps, and the program's count of
// connections that could not move to a full conntrack map
// (bpfmaps.ConntrackMaps). Writes: deletes of expired entries (the
// conntrack-gc job, whose health is Degraded with ErrMapFull while the
// conntrack map is full) and of every entry (conntrack/flush).
// Metrics: ipcache_agent_conntrack_*, contributed to the metrics cell, and
// the conntrack and ct_opening maps' series of cilium_bpf_map_pressure
// (metrics.MapPressure) (metrics.go).
package conntrackcell
