// SPDX-License-Identifier: Apache-2.0

// Package bpfmaps is the agent's pinned BPF maps as an ABI: their key and
// value layouts (abi.go, conntrack.go, counters.go, reason.go, the records
// of the dns-answers ring in dnsanswers.go), names and
// specs (mapspecs.go), and their handling on bpffs, for the datapath and
// for the tools and tests that read what it enforces.
//
// It owns the pin directory <bpf-root>/ipcache-agent/ (PinDir) and what
// is done to the pins: bpffs mounted at --bpf-root (EnsureBPFFS; never from
// a mount namespace other than the host's, where the mount, and the pins,
// would not outlive the agent; IsBPFFS tells whether a path is one), the maps
// opened, migrated or replaced at start (Open: a map of the expected
// layout is reused, one that differs only in max entries migrated, one of
// an older layout converted, any other replaced), read (ReadIPCache,
// ReadPolicy, ReadEnforcement, ReadIPCacheMap, ReadEntries, ReadCounters),
// listed (AttachedPrograms, for `version`) and removed (Cleanup).
// PinnedIPCache is how the datapath hands its one read of the pinned
// ipcache map to restore.
//
// Reads: the pinned maps and links under --bpf-root. Writes: the pins
// (Open, Cleanup) and the bpffs mount (EnsureBPFFS); never a map's entries
// after Open, which the datapath's writers and the program own.
package bpfmaps
