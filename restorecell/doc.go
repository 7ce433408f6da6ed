// SPDX-License-Identifier: Apache-2.0

// Package restorecell keeps identity numbers stable across restarts.
//
// Its start hook waits for the identity checkpoint (the identity cell's
// start hook reads it) and withholds its label identities for the label
// sets that had them (identitycell.Allocator.WithholdForLabels), which get
// them back when they ask for an identity. A job started right after it
// restores the pinned ipcache map (bpfmaps.PinnedIPCache: the datapath
// cell's read, before anything wrote to the map, taken a block at a time),
// while the other owners re-assert their prefixes. Every entry with a
// local-scope identity is restored: its number is withheld, and the
// prefix is upserted through the restore resource handle (source
// `restored`) with its old number as the requested identity and, when the
// checkpoint's labels for it hold more than its cidr label, those labels
// (a row without labels resolves to the cidr label alone). The pinned
// map's entries of label identities are not restored (their endpoints'
// sources re-create them). Until the job is done, it holds the allocator's local
// space (identitycell.Allocator.HoldLocal): the ipcache resolves the
// prefixes restore has spoken for with their old numbers, and a prefix
// that would need a new number waits, so a prefix that another owner
// re-asserts first still gets its old number. A pinned map that cannot be
// read stops the agent.
//
// A job then waits --identity-restore-grace-period and releases the handle
// (gradually) and un-withholds the numbers (at the same pace: each that is
// allocated has its row in the `identities` table rewritten).
// Entries that a real owner re-asserted in the meantime stay, with their
// numbers; the rest go. Stopping the agent during the grace period releases
// nothing: the next run restores again from what is pinned.
//
// The restore cell never holds identity references: only the ipcache does,
// one per prefix, whoever its owners are.
//
// Metrics: ipcache_agent_restore_*, the restore's status, contributed to
// the metrics cell (metrics.go).
package restorecell
