// SPDX-License-Identifier: Apache-2.0

package policygen

import (
	"fmt"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The shape of the label-peer workload that policycell's
// BenchmarkPeerRelabel and cells' BenchmarkPeerLabelChangeToKernel share,
// so that their figures are of the same policies: per namespace, label
// sets of PeerApps apps times PeerTiers tiers (a team per two apps), and
// PeerPoliciesPerNS policies over PeerSelectorsPerNS distinct peer
// selectors.
const (
	PeerApps           = 10
	PeerTiers          = 5
	PeerPoliciesPerNS  = 125
	PeerSelectorsPerNS = 25
)

// PeerPolicies returns the policies of namespaces ns-0 to
// ns-<namespaces-1>: policy p of namespace ns applies to app a-<p%10> of
// ns and allows in, on TCP/8080-8083, from its peer selector p%25 and
// out, on TCP/443, to its peer selector (7p+3)%25 (PeerSelectors).
func PeerPolicies(namespaces int) []*policy.Policy {
	var policies []*policy.Policy
	for n := range namespaces {
		ns := fmt.Sprintf("ns-%d", n)
		selectors := PeerSelectors(ns)
		for p := range PeerPoliciesPerNS {
			policies = append(policies, &policy.Policy{
				Name: fmt.Sprintf("%s-p%d", ns, p), File: ns + ".yaml", Line: 1 + p,
				Selector: policy.EndpointSelector{Namespace: ns, MatchLabels: map[string]string{"app": fmt.Sprintf("a-%d", p%PeerApps)}},
				Ingress: []policy.Rule{{
					Endpoints: []policy.EndpointSelector{selectors[p%PeerSelectorsPerNS]},
					Ports:     []policy.PortRange{{Port: uint16(8080 + p%4), Protocol: policy.ProtocolTCP}},
				}},
				Egress: []policy.Rule{{
					Endpoints: []policy.EndpointSelector{selectors[(p*7+3)%PeerSelectorsPerNS]},
					Ports:     []policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}},
				}},
			})
		}
	}
	return policies
}

// PeerSelectors are the PeerSelectorsPerNS distinct peer selectors of
// namespace ns: by app, by tier, by team, and tier in two tiers.
func PeerSelectors(ns string) []policy.EndpointSelector {
	var out []policy.EndpointSelector
	one := func(k, v string) policy.EndpointSelector {
		return policy.EndpointSelector{Namespace: ns, MatchLabels: map[string]string{k: v}}
	}
	for a := range PeerApps {
		out = append(out, one("app", fmt.Sprintf("a-%d", a)))
	}
	for t := range PeerTiers {
		out = append(out, one("tier", fmt.Sprintf("t-%d", t)))
	}
	for team := range PeerApps / 2 {
		out = append(out, one("team", fmt.Sprintf("team-%d", team)))
	}
	for t := range PeerTiers {
		out = append(out, policy.EndpointSelector{Namespace: ns, MatchExpressions: []policy.Requirement{{
			Key: "tier", Operator: policy.OpIn, Values: []string{fmt.Sprintf("t-%d", t), fmt.Sprintf("t-%d", (t+1)%PeerTiers)}}}})
	}
	return out
}
