// SPDX-License-Identifier: Apache-2.0

// Package ipcachecell maps IP prefixes to security identities from the
// metadata of many owners.
//
// Owners (policies, the previous run's prefixes, an embedding agent) each
// obtain a [Handle] for their resource and upsert and remove metadata for
// prefixes through it: labels, a requested identity number, or an explicit identity allocated
// elsewhere. The metadata lives in the `ipcache-metadata` table, one row per
// (prefix, resource).
//
// A resolver job merges the rows of each changed prefix (labels are the
// union, plus the prefix's own cidr label; requested and explicit identities
// and the entry's source come from the highest-precedence resource) and
// writes the desired `ipcache` table: prefix -> identity, source. The
// ipcache holds exactly one identity reference per entry whose identity is
// not explicit; it changes it by allocating the new identity before
// releasing the old one, and releases it when the prefix's last metadata
// goes. Nobody else releases these references.
//
// Producers register with [IPCache.RegisterProducer]; the `ipcache` table is
// initialized once all are done and resolved. While the allocator's local
// space is held (restore, until it has withheld the previous run's
// numbers: identitycell.Allocator.HoldLocal), a prefix that needs a new
// local number waits, and the others are resolved. The resolver,
// the allocator's client, is the producer of the `identities` table: it
// marks it initialized with the `ipcache` table.
//
// Reads: identities (through the allocator). Writes: `ipcache-metadata`
// (through handles), `ipcache`, identity references.
// Metrics: ipcache_agent_ipcache_entries, contributed to the metrics cell
// (metrics.go).
package ipcachecell
