// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The DNS rule every example gives its endpoints, in each format.
const (
	cnpDNSRule    = "    - toEndpoints: [{matchLabels: {k8s-app: kube-dns}}]\n      toPorts:\n        - ports: [{port: \"53\", protocol: ANY}]\n          rules: {dns: [{matchPattern: \"*\"}]}\n"
	nativeDNSRule = "  - toPorts: [{port: 53, rules: {dns: [{matchPattern: \"*\"}]}}]\n"
)

// TestFQDNParse: toFQDNs and DNS rules are read into the model in the
// Cilium formats and the native one, with Cilium's rules for them.
func TestFQDNParse(t *testing.T) {
	tcp53 := policy.PortRange{Protocol: policy.ProtocolTCP, Port: 53}
	udp53 := policy.PortRange{Protocol: policy.ProtocolUDP, Port: 53}
	sctp53 := policy.PortRange{Protocol: policy.ProtocolSCTP, Port: 53}
	https := []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 443}}
	all := []fqdn.Selector{{MatchPattern: "*"}}
	names := []fqdn.Selector{{MatchName: "api.example.com"}, {MatchPattern: "*.example.com"}}
	for _, tc := range []struct {
		name, content string
		want          []policy.Rule
	}{
		{"CNP toFQDNs with ports", cnpHead + "spec:\n  egress:\n    - toFQDNs: [{matchName: api.example.com}, {matchPattern: \"*.example.com\"}]\n      toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n" + cnpDNSRule,
			[]policy.Rule{
				{FQDN: &policy.FQDNRule{Selectors: names}, Ports: https, Name: "egress[0]", Line: 6},
				{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"k8s-app": "kube-dns"}, Namespace: "default"}},
					Ports: []policy.PortRange{tcp53, udp53, sctp53}, FQDN: &policy.FQDNRule{DNS: []policy.DNSRule{{Ports: []policy.PortRange{tcp53, udp53}, Names: all}}},
					Name: "egress[1]", Line: 8},
			}},
		{"CCNP toFQDNs without ports", ccnpHead + "spec:\n  egress:\n    - toFQDNs: [{matchName: API.example.com.}]\n    - toPorts: [{ports: [{port: \"53\", protocol: UDP}, {port: \"5353\", protocol: TCP}], rules: {dns: [{matchName: a.example}]}}]\n",
			[]policy.Rule{
				{FQDN: &policy.FQDNRule{Selectors: []fqdn.Selector{{MatchName: "API.example.com."}}}, Name: "egress[0]", Line: 6},
				{AnyPeer: true, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 5353}, udp53},
					FQDN: &policy.FQDNRule{DNS: []policy.DNSRule{{Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 5353}, udp53}, Names: []fqdn.Selector{{MatchName: "a.example"}}}}},
					Name: "egress[1]", Line: 7},
			}},
		{"CNP DNS rules beside plain ports", cnpHead + "spec:\n  egress:\n    - toPorts:\n        - ports: [{port: \"53\"}]\n          rules: {dns: [{matchPattern: \"*\"}]}\n        - ports: [{port: \"443\", protocol: TCP}]\n",
			[]policy.Rule{{AnyPeer: true, Ports: []policy.PortRange{tcp53, https[0], udp53, sctp53},
				FQDN: &policy.FQDNRule{DNS: []policy.DNSRule{{Ports: []policy.PortRange{tcp53, udp53}, Names: all}}}, Name: "egress[0]", Line: 6}}},
		{"native", "name: a\negress:\n  - toFQDNs: [{matchPattern: \"*.example.com\"}]\n    toPorts: [{port: 443, protocol: TCP}]\n" + nativeDNSRule,
			[]policy.Rule{
				{FQDN: &policy.FQDNRule{Selectors: []fqdn.Selector{{MatchPattern: "*.example.com"}}}, Ports: https, Name: "egress[0]", Line: 3},
				{AnyPeer: true, Ports: []policy.PortRange{tcp53, udp53}, FQDN: &policy.FQDNRule{DNS: []policy.DNSRule{{Ports: []policy.PortRange{tcp53, udp53}, Names: all}}},
					Name: "egress[1]", Line: 5},
			}},
		{"native DNS rule on one of its ports", "name: a\negress:\n  - toCIDR: [10.0.0.10]\n    toPorts: [{port: 53, protocol: UDP, rules: {dns: [{matchName: a.example}]}}, {port: 853, protocol: TCP}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.10/32")}}, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 853}, udp53},
				FQDN: &policy.FQDNRule{DNS: []policy.DNSRule{{Ports: []policy.PortRange{udp53}, Names: []fqdn.Selector{{MatchName: "a.example"}}}}}, Name: "egress[0]", Line: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parsed, err := ParseFile("good.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Len(t, parsed.Policies, 1)
			require.Equal(t, tc.want, withoutColumns(parsed.Policies[0].Egress))
		})
	}
}

// TestFQDNReject: what Cilium rejects of toFQDNs and DNS rules, and the
// L7 rules this agent does not enforce, reject the file at the position.
func TestFQDNReject(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"bad matchName", cnpHead + "spec:\n  egress:\n    - toFQDNs: [{matchName: \"a..example\"}]\n",
			`bad.yaml:6:29: invalid policy file: policy "default/p": spec.egress[0].toFQDNs[0]: invalid matchName "a..example": empty label`},
		{"bad matchPattern", cnpHead + "spec:\n  egress:\n    - toFQDNs:\n        - matchPattern: \"**.example\"\n",
			`bad.yaml:7:25: invalid policy file: policy "default/p": spec.egress[0].toFQDNs[0]: invalid matchPattern "**.example": "**" is not supported`},
		{"both", cnpHead + "spec:\n  egress:\n    - toFQDNs: [{matchName: a.example, matchPattern: \"*\"}]\n",
			`bad.yaml:6:54: invalid policy file: policy "default/p": spec.egress[0].toFQDNs[0]: toFQDNs selector has both matchName and matchPattern`},
		{"empty selector", cnpHead + "spec:\n  egress:\n    - toFQDNs: [{}]\n",
			`bad.yaml:6:17: invalid policy file: policy "default/p": spec.egress[0].toFQDNs[0]: toFQDNs selector needs matchName or matchPattern`},
		{"unknown selector field", cnpHead + "spec:\n  egress:\n    - toFQDNs: [{matchNames: a}]\n",
			`bad.yaml:6:18: invalid policy file: policy "default/p": spec.egress[0].toFQDNs[0]: unknown field "matchNames", want one of matchName, matchPattern`},
		{"empty toFQDNs", cnpHead + "spec:\n  egress:\n    - toFQDNs: []\n",
			`bad.yaml:6:16: invalid policy file: policy "default/p": spec.egress[0].toFQDNs: empty list, omit the field instead`},
		{"toFQDNs with toCIDR", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toFQDNs: [{matchName: a.example}]\n",
			`bad.yaml:7:7: invalid policy file: policy "default/p": spec.egress[0]: toCIDR and toFQDNs in one rule: Cilium does not support combining them`},
		{"toFQDNs in egressDeny", cnpHead + "spec:\n  egressDeny:\n    - toFQDNs: [{matchName: a.example}]\n",
			`bad.yaml:6:7: invalid policy file: policy "default/p": spec.egressDeny[0].toFQDNs: not allowed in egressDeny (as Cilium: deny rules have no toFQDNs)`},
		{"toFQDNs in ingress", cnpHead + "spec:\n  ingress:\n    - toFQDNs: [{matchName: a.example}]\n",
			`bad.yaml:6:7: invalid policy file: policy "default/p": spec.ingress[0]: unknown field "toFQDNs"`},
		{"DNS rules on ingress", cnpHead + "spec:\n  ingress:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:6:54: invalid policy file: policy "default/p": spec.ingress[0].toPorts[0].rules.dns: DNS rules are not allowed on ingress`},
		{"DNS rules in egressDeny", cnpHead + "spec:\n  egressDeny:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:6:54: invalid policy file: policy "default/p": spec.egressDeny[0].toPorts[0].rules.dns: DNS rules are not allowed in deny rules`},
		{"DNS rules on port 0", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"0\", protocol: UDP}], rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:6:26: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0]: DNS rules need the DNS port: port 0 (every port) is not allowed with them`},
		{"DNS rules on a range", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\", endPort: 54}], rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:6:26: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0]: DNS rules do not support port ranges`},
		{"DNS rules on SCTP", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\", protocol: SCTP}], rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:6:26: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0]: DNS rules apply to TCP, UDP or ANY, not SCTP`},
		{"DNS rules without ports", cnpHead + "spec:\n  egress:\n    - toPorts: [{rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:6:17: invalid policy file: policy "default/p": spec.egress[0].toPorts[0]: ports is required`},
		{"empty dns", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {dns: []}}]\n",
			`bad.yaml:6:54: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules.dns: empty list, omit the field instead`},
		{"bad DNS pattern", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchPattern: \"a/b\"}]}}]\n",
			`bad.yaml:6:70: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules.dns[0]: invalid matchPattern "a/b"`},
		{"empty rules", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {}}]\n",
			`bad.yaml:6:48: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules: empty: want dns`},
		{"http rules", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"80\", protocol: TCP}], rules: {http: [{method: GET}]}}]\n",
			`bad.yaml:6:56: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules: L7 rules are not supported: this agent enforces L3 and L4 only (and DNS rules, rules.dns), not http`},
		{"kafka beside dns", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchPattern: \"*\"}], kafka: [{}]}}]\n",
			`bad.yaml:6:41: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules: L7 rules are not supported: this agent enforces L3 and L4 only (and DNS rules, rules.dns), not kafka`},
		{"unknown L7 field", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\"}], rules: {dnss: []}}]\n",
			`bad.yaml:6:49: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules: unknown field "dnss", want one of dns, http, kafka, l7proto, l7`},
		{"native toFQDNs in egressDeny", "name: a\negressDeny:\n  - toFQDNs: [{matchName: a.example}]\n",
			`bad.yaml:3:5: invalid policy file: policy "a": egressDeny[0].toFQDNs: not allowed in egressDeny`},
		{"native toFQDNs with toEndpoints", "name: a\negress:\n  - toEndpoints: [{}]\n    toFQDNs: [{matchName: a.example}]\n",
			`bad.yaml:4:5: invalid policy file: policy "a": egress[0]: toEndpoints and toFQDNs in one rule`},
		{"native bad name", "name: a\negress:\n  - toFQDNs: [{matchName: \"a b\"}]\n",
			`bad.yaml:3:27: invalid policy file: policy "a": egress[0].toFQDNs[0]: invalid matchName "a b": character ' ' at 1`},
		{"native DNS rules on ingress", "name: a\ningress:\n  - toPorts: [{port: 53, rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:3:39: invalid policy file: policy "a": ingress[0].toPorts[0].rules.dns: DNS rules are not allowed on ingress`},
		{"native DNS rules on a range", "name: a\negress:\n  - toPorts: [{port: 53, endPort: 60, rules: {dns: [{matchPattern: \"*\"}]}}]\n",
			`bad.yaml:3:15: invalid policy file: policy "a": egress[0].toPorts[0]: DNS rules do not support port ranges`},
		{"native http rules", "name: a\negress:\n  - toPorts: [{port: 80, rules: {http: [{}]}}]\n",
			`bad.yaml:3:26: invalid policy file: policy "a": egress[0].toPorts[0].rules: L7 rules are not supported`},
		{"NetworkPolicy has no toFQDNs", netpolHead + "spec:\n  policyTypes: [Egress]\n  egress:\n    - toFQDNs: [{matchName: a.example}]\n",
			`bad.yaml:7:7: invalid policy file: policy "networkpolicy/default/p": spec.egress[0]: unknown field "toFQDNs"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.content))
			require.ErrorIs(t, err, ErrInvalidPolicy)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestFQDNWarning: a toFQDNs rule whose policy's endpoints no policy of
// the file gives a DNS rule is a warning at the rule (the file is
// valid); a DNS rule of the same policy, or of one whose selector
// selects all of its endpoints, gives them one.
func TestFQDNWarning(t *testing.T) {
	toFQDNs := "    - toFQDNs: [{matchName: api.example.com}]\n"
	web := "  endpointSelector: {matchLabels: {app: web, tier: front}}\n"
	for _, tc := range []struct {
		name, content string
		want          []string
	}{
		{"no DNS rule", cnpHead + "spec:\n  egress:\n" + toFQDNs,
			[]string{`good.yaml:6:7: policy "default/p": egress[0].toFQDNs: no policy in this file gives its endpoints a DNS rule`}},
		{"same policy", cnpHead + "spec:\n  egress:\n" + toFQDNs + cnpDNSRule, nil},
		{"native", "name: a\negress:\n  - toFQDNs: [{matchPattern: \"*\"}]\n" + nativeDNSRule, nil},
		{"native without", "name: a\negress:\n  - toPorts: [{port: 53}]\n  - toFQDNs: [{matchPattern: \"*\"}]\n",
			[]string{`good.yaml:4:5: policy "a": egress[1].toFQDNs: no policy in this file gives its endpoints a DNS rule`}},
		{"another policy for every endpoint", cnpHead + "spec:\n" + web + "  egress:\n" + toFQDNs +
			"---\n" + ccnpHead + "spec:\n  egress:\n" + cnpDNSRule, nil},
		{"another policy for fewer labels", cnpHead + "spec:\n" + web + "  egress:\n" + toFQDNs +
			"---\n" + ccnpHead + "spec:\n  endpointSelector: {matchLabels: {app: web}}\n  egress:\n" + cnpDNSRule, nil},
		{"another policy for other endpoints", cnpHead + "spec:\n" + web + "  egress:\n" + toFQDNs +
			"---\n" + ccnpHead + "spec:\n  endpointSelector: {matchLabels: {app: db}}\n  egress:\n" + cnpDNSRule,
			[]string{`good.yaml:7:7: policy "default/p": egress[0].toFQDNs: no policy in this file gives its endpoints a DNS rule`}},
		{"another namespace", cnpHead + "spec:\n  egress:\n" + toFQDNs +
			"---\n" + "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: dns, namespace: other}\nspec:\n  egress:\n" + cnpDNSRule,
			[]string{`good.yaml:6:7: policy "default/p": egress[0].toFQDNs: no policy in this file gives its endpoints a DNS rule`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parsed, err := ParseFile("good.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Len(t, parsed.Warnings, len(tc.want), "%v", parsed.Warnings)
			for i, w := range parsed.Warnings {
				require.Contains(t, w.String(), tc.want[i])
				require.Contains(t, w.String(), "unless a policy of another file gives them one")
			}
		})
	}
	// The warnings stay in file order with the others.
	parsed, err := ParseFile("good.yaml", []byte("name: a\negress:\n  - toFQDNs: [{matchPattern: \"*\"}]\n  - toCIDR: [10.0.0.1/8]\n"))
	require.NoError(t, err)
	require.Len(t, parsed.Warnings, 2)
	require.Equal(t, 3, parsed.Warnings[0].Line)
	require.Equal(t, 4, parsed.Warnings[1].Line)
}
