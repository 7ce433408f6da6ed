// SPDX-License-Identifier: Apache-2.0

// Package podcell is the example embedding agent's own cell: it publishes
// pod IPs with identities allocated elsewhere (in a real agent, by the
// cluster's identity allocator) into the ipcache.
//
// It reads --pods-file at start and every --pods-file-interval, and owns
// one ipcache resource handle, "pods" with source k8s, holding each pod's
// /32 or /128 with Metadata{ExplicitIdentity: N}. The ipcache maps those
// prefixes to N and allocates no local identity for them. The cell
// registers itself as an ipcache producer ("pods-file") and says it is done
// after its first complete read, so the `ipcache` table is not initialized,
// and the datapath does not prune the pinned map, before the pods are
// known: after a restart, the pods' entries in the pinned map are never
// removed and re-added.
//
// A pods file that cannot be read or parsed at start fails the start. Later,
// the pods in force stay in force and the cell's health is degraded until
// the file is valid again.
//
// Reads: --pods-file. Writes: ipcache metadata through the "pods" handle.
package podcell
