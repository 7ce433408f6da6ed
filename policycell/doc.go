// SPDX-License-Identifier: Apache-2.0

// Package policycell turns CIDR policy files into the desired policy map.
//
// The directory job reads --policy-dir (docs/CONTRACT.md, "Policy files") at start
// and whenever it changes. A file is the unit of validity: a file that
// cannot be read or parsed, or that reuses the name of a policy another file
// has in force, is rejected as a whole, reported with its name and position,
// and the version of it that was in force stays in force. Each policy in
// force owns an ipcache resource handle, "policy/<name>" with source
// directory, for its CIDRs and except prefixes, and is a row of the
// `policies` table. A file that becomes empty keeps its policies in force
// (an editor truncates a file before writing it again); removing the file
// removes them. A file is capped at 4 MiB, and its parse's memory is a
// bounded multiple of its size. A file's documents are native policies,
// CiliumNetworkPolicies, CiliumClusterwideNetworkPolicies, NetworkPolicies
// or Lists of them, read by policyfile.Parse; what the
// agent cannot enforce rejects the file. ValidateFiles checks
// files the same way without an agent.
//
// The selector job matches the policies' CIDR selectors against the
// identities table: a CIDR selects every identity with a cidr label inside
// it (whoever allocated it), minus those inside its except prefixes; the
// all-addresses CIDRs also select world; rules for every peer give the
// entries of identity 0 (any identity). It writes the desired `policy`
// table (one row per policy-map key: a port range as aligned blocks, a
// deny winning over the allows inside it, with the policies and rules
// behind it) and `policy-enforcement` (default deny, deny rules only, or
// neither, as the policies and --enable-policy say), incrementally: a
// change costs what it selects, not the number of policies or identities.
// Entries and enforcement are per subject: each policy applies to the
// local endpoint identities its selector matches (the `endpoints` table,
// when the hive has an endpoint cell) and, when its selector is empty, to
// the host-wide default (subject 0).
// policy.Resolve resolves a packet as the enforcement program does, for
// policy/explain and the datapath's events.
//
// The versions of the files in force are saved in the state directory, so
// that after a restart a file that is invalid then keeps the version in
// force before it, and a policy name stays with the file that held it.
//
// Reads: --policy-dir, --state-dir/policies-in-force.json, the
// `identities`, `ipcache` and (optional) `endpoints` tables.
// The selector job also writes `dns-rules`: the names the DNS rules of
// each subject's policies allow, for the DNS proxy. toFQDNs selectors
// select the identities with their fqdn label, and the ports of egress
// DNS rules are dns-proxy entries; a hive without a DNS proxy
// (policy.FQDNEnforcer) rejects files with either.
//
// Writes: `policies`, `policy`, `policy-enforcement`, `dns-rules`;
// --state-dir/policies-in-force.json; ipcache metadata through the
// policies' handles.
// Metrics: cilium_policy and ipcache_agent_policy_files, contributed to the
// metrics cell (metrics.go).
package policycell
