// SPDX-License-Identifier: Apache-2.0

// Package fqdn owns the DNS-name side of toFQDNs policies: the selectors
// (matchName, matchPattern with Cilium's syntax) and their matching, the
// reading of a DNS response into the addresses its question name resolves
// to (CNAME chains followed, bounded), and the cache of names learned
// from DNS answers with Cilium's retention: each address live for its TTL
// (at least a minimum), then deferred while a connection uses it and an
// idle grace period after, within a per-name, a live and a deferred cap,
// and its checkpoint encoding.
//
// It reads DNS messages (github.com/miekg/dns) and the time; it writes
// nothing: it holds no socket, no BPF map, no file and no identity. The
// DNS proxy, the identities of the selectors' labels ("fqdn:<selector>"),
// the ipcache entries and the checkpoint file (written atomically) belong
// to the cell built on it, which owns a [Cache], serializes its calls,
// supplies the connection tracker's view to [Cache.GC] and releases what
// the removed pairs allowed.
package fqdn
