// SPDX-License-Identifier: Apache-2.0

// Package policy is the vocabulary of network policy that the policy
// cell, the datapath, the monitor and the metrics share: what a validated
// policy says ([Policy], [Rule], [CIDRSelector], [PortRange], [FQDNRule]), the desired
// policy-map entries ([Key], [Entry], [Verdict]) and how each direction is
// enforced ([Enforcement]), as rows of the `policy` and
// `policy-enforcement` tables, the DNS names each subject's DNS rules
// allow ([DNSRules], the `dns-rules` table, for the DNS proxy, whose cell
// provides [FQDNEnforcer]), and the rules by which the enforcement
// program resolves a packet against them ([Lookup], [Resolve]).
//
// It is a leaf: it imports no cell. How a key is encoded in the BPF map
// belongs to the map (the datapath); how files become policies belongs to
// the policy file formats; which entries are desired belongs to the
// policy cell.
package policy
