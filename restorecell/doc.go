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
// local-scope identity is restored: its number is withheld, and the ipcache
// is told the prefix's old number (ipcachecell.IPCache.AddPrevious), which
// the resolver requests for a prefix whose rows request none. A prefix
// whose checkpointed labels hold more than its cidr label gets a row
// through the restore resource handle (source `restored`) instead, with
// its old number and those labels. The pinned map's entries of label
// identities are not restored (their endpoints' sources re-create them).
// Until the map is read, the job holds the allocator's local space
// (identitycell.Allocator.HoldLocal): a prefix that would need a new
// number waits, so a prefix that another owner re-asserts first still
// gets its old number. A pinned map that cannot be read stops the agent.
//
// Restore speaks last: once every other producer is done and resolved, it
// writes a row for each told prefix that has no entry (nobody re-asserted
// it), then marks itself done, and the grace period starts. During it, a
// told prefix whose last row goes keeps its entry, and restore writes it a
// row (ipcachecell.IPCache.Orphans).
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
