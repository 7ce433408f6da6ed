// SPDX-License-Identifier: Apache-2.0

// Package identitycell allocates the security identities of this node:
// local (CIDR) identities, and label identities (of endpoints, by their
// labels) in the cluster range.
//
// It owns the `identities` statedb table, whose rows are the allocated
// numbers and not a copy of them: every allocation and release is a write
// to the table, so the table can never disagree with the allocator, and
// other cells watch it to learn of identities as they come and go.
//
// An identity is determined by its label set: allocating the same labels
// again returns the same number and takes another reference; releasing the
// last reference frees the number. A request may name the number it wants
// (restore uses this to keep numbers stable across restarts); numbers can be
// withheld so that only a request naming them gets them. The withheld
// numbers are a bitmap in the allocator ([Allocator.NumWithheld] counts
// them), not rows: a restart withholds a million, and rows cost it a
// million table writes before anything else could start. An allocated
// number's row says whether it is withheld.
//
// The allocator's clients register as producers of identities
// ([Allocator.RegisterProducer]); the table is initialized once all are
// done, and the checkpoint is first written then.
//
// Reads: --state-dir (statedir.Config; the previous checkpoint, once, at
// start).
// Writes: the `identities` table; <state-dir>/local-identities.json, an
// atomic checkpoint of number -> labels (local and label identities) that
// the next run restores from.
// Shell: identity/list and identity/get, with the users other cells
// contribute (the `identity-users` value group, [UsersOut]).
// Metrics: ipcache_agent_identities, contributed to the metrics cell
// (metrics.go).
package identitycell
