// SPDX-License-Identifier: Apache-2.0

// Package fqdncell enforces toFQDNs policies: it runs the transparent DNS
// proxy (package dnsproxy) the enforcement program steers the endpoints'
// DNS to, answers for the names their DNS rules allow only, and learns
// the addresses of the answers (package fqdn's cache) as ipcache entries
// whose identities the toFQDNs selectors select.
//
// An address learned from DNS maps to the identity of the labels
// `fqdn:<selector>` of every selector in force that matches one of its
// names, plus the cidr label of the longest prefix another owner holds
// that covers it (0.0.0.0/0 or ::/0 when none): the addresses of a
// selector share one identity (ipcachecell.SharedIdentity), so a new
// address costs an ipcache write, and CIDR selectors still select the
// address as they would without its name. An answer reaches its client
// only once the ipcache map holds its selected addresses (which the
// datapath writes after their identity's policy entries), or
// --tofqdns-proxy-response-max-delay passed (counted and logged).
//
// Reads: the `policies` table (the toFQDNs selectors in force), the
// `dns-rules` table (the names each subject may resolve), the `endpoints`
// table (a client's subject), the `ipcache-metadata` table (covering
// prefixes), the `ipcache` table (identities, and the revision to wait
// for), the conntrack maps (addresses still in use once expired), the
// checkpoint <state-dir>/fqdn-cache.json at start.
//
// Writes: the ipcache resource `fqdn` (source generated) through its
// handle; the checkpoint, when the names change (at most once per
// collection interval) and at stop; the proxy's port through the
// datapath (dnsproxy.Datapath); in the agent's network namespace, the policy rule and local
// routes that deliver the steered packets to the proxy (fwmark
// 0x200/0xf00, table 2004).
//
// Restart: the checkpoint is restored once the policies are loaded and
// before the ipcache table is initialized (the cell is an ipcache
// producer), so the learned addresses keep their entries and, with
// restore's requested numbers, their identities.
package fqdncell
