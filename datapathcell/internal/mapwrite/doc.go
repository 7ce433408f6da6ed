// SPDX-License-Identifier: Apache-2.0

// Package mapwrite holds the datapath cell's reconciler operations that
// write a statedb table's objects into one BPF map, one key/value per
// object (Ops): in batches, with a per-key fallback where the kernel has
// no batch operations for the map, skipping the writes whose value the
// map already holds after a restart.
//
// It knows nothing of the other maps: the hooks Ops takes (Gate, Hold,
// Fallbacks, Failed and Written) are how the datapath cell's ordering
// keeps a change from dropping what is allowed before and after it (make
// before break: datapathcell/README.md).
//
// Owns: the writes to the map it is given (Map) and the count of them
// (Stats), and what the pinned map held before the first write
// (KnownValues: read from the map, or kept over the datapath's snapshot
// of the pinned ipcache map, NewSnapshotValues). Reads: the objects the
// reconciler hands it, and the map. Writes: the map.
package mapwrite
