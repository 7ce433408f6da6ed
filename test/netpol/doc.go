// SPDX-License-Identifier: Apache-2.0

// Package netpol checks that the agent enforces Kubernetes NetworkPolicy
// and Cilium's label peers as Kubernetes and Cilium document them: a table
// of scenarios (a namespace of workloads, clients in the same and in
// another namespace, the internet), each a set of policy files and the
// verdicts they must give. The scenarios follow the cases of public
// NetworkPolicy conformance suites (same and other namespace, empty
// from, empty ingress, OR of peers, AND inside one peer, allow-all
// overriding a narrower policy, egress to pods blocking the internet,
// ports without a number), written here in our own words.
//
// Each scenario runs the control plane (identity, ipcache, endpoint and
// policy cells) with the files in --endpoint-dir and --policy-dir and
// reads each verdict from `policy/explain`, which resolves the `policy`
// table as the program resolves the policy map (the privileged tests in
// cmd/ipcache-agent check that the maps give the same verdicts to real
// packets).
//
// It reads and writes nothing outside its temporary directories.
package netpol
