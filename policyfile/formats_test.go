// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// rulesOnly returns the policies with what does not decide enforcement
// (names, files, lines, kinds) cleared: the selectors compute the
// `policy` table from the directions, peers and ports alone, so equal
// results here are equal tables.
func rulesOnly(policies []*policy.Policy) []policy.Policy {
	out := make([]policy.Policy, len(policies))
	for i, p := range policies {
		out[i] = policy.Policy{Ingress: clearRuleNames(p.Ingress), Egress: clearRuleNames(p.Egress)}
	}
	return out
}

func clearRuleNames(rules []policy.Rule) []policy.Rule {
	var out []policy.Rule
	for _, r := range rules {
		r.Name, r.Line, r.Column = "", 0, 0
		out = append(out, r)
	}
	return out
}

// withoutColumns returns the rules with Column 0: the tests that name
// each rule's line leave its column (for errors about the whole rule,
// CountEntries) to TestParseFullModel.
func withoutColumns(rules []policy.Rule) []policy.Rule {
	var out []policy.Rule
	for _, r := range rules {
		r.Column = 0
		out = append(out, r)
	}
	return out
}

func parseFixture(t *testing.T, name string) []*policy.Policy {
	t.Helper()
	content, err := os.ReadFile(filepath.Join("testdata", "formats", name))
	require.NoError(t, err)
	policies, err := Parse(name, content)
	require.NoError(t, err, name)
	return policies
}

// TestFormatsMatchNative: each file of testdata/formats holds the
// policies of native.yaml in another format, and gives the same rules,
// under the names and kinds of its format.
func TestFormatsMatchNative(t *testing.T) {
	for _, tc := range []struct {
		native, file string
		names        []string
		kinds        []string
	}{
		{"native.yaml", "cnp-spec.yaml", []string{"shop/web", "shop/dns"}, []string{policy.KindCNP, policy.KindCNP}},
		{"native.yaml", "cnp-specs.yaml", []string{"shop/web", "shop/dns"}, []string{policy.KindCNP, policy.KindCNP}},
		{"native.yaml", "ccnp.yaml", []string{"web", "dns"}, []string{policy.KindCCNP, policy.KindCCNP}},
		{"native.yaml", "networkpolicy.yaml", []string{"networkpolicy/shop/web", "networkpolicy/shop/dns"}, []string{policy.KindNetworkPolicy, policy.KindNetworkPolicy}},
		{"native.yaml", "list.yaml", []string{"shop/web", "networkpolicy/shop/dns"}, []string{policy.KindCNP, policy.KindNetworkPolicy}},
		{"native.yaml", "mixed.yaml", []string{"web", "dns"}, []string{policy.KindNative, policy.KindCCNP}},
		// Deny, endPort, icmps, ports for every peer, enableDefaultDeny.
		{"native-cilium.yaml", "cnp-cilium.yaml", []string{"shop/edge", "networkpolicy/shop/ranges"}, []string{policy.KindCNP, policy.KindNetworkPolicy}},
		{"native-cilium.yaml", "ccnp-cilium.yaml", []string{"edge", "shop/ranges"}, []string{policy.KindCCNP, policy.KindCNP}},
		{"native-cilium.yaml", "list-cilium.yaml", []string{"shop/edge", "networkpolicy/shop/ranges"}, []string{policy.KindCNP, policy.KindNetworkPolicy}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			native := parseFixture(t, tc.native)
			require.Len(t, native, 2)
			policies := parseFixture(t, tc.file)
			require.Equal(t, rulesOnly(native), rulesOnly(policies))
			for i, p := range policies {
				require.Equal(t, tc.names[i], p.Name)
				require.Equal(t, tc.kinds[i], p.Kind)
				require.Equal(t, tc.file, p.File)
				require.Equal(t, native[i].Prefixes(), p.Prefixes())
			}
		})
	}
}

// TestCNPAndNetworkPolicyShareAName: a CiliumNetworkPolicy and a
// NetworkPolicy of one namespace and name are two policies, as in
// Kubernetes (two kinds of object); two of one kind are one name twice.
func TestCNPAndNetworkPolicyShareAName(t *testing.T) {
	content := cnpHead + "spec: {egress: [{}]}\n---\n" + netpolHead + "spec: {podSelector: {}}\n"
	policies, err := Parse("good.yaml", []byte(content))
	require.NoError(t, err)
	require.Len(t, policies, 2)
	require.Equal(t, "default/p", policies[0].Name)
	require.Equal(t, "networkpolicy/default/p", policies[1].Name)
	require.Equal(t, "policy/networkpolicy/default/p", policies[1].Resource())

	_, err = Parse("bad.yaml", []byte(content+"---\n"+netpolHead+"spec: {podSelector: {}}\n"))
	require.ErrorIs(t, err, ErrInvalidPolicy)
	require.ErrorContains(t, err, `bad.yaml:13:18: invalid policy file: name "networkpolicy/default/p" is already used at line 8`)
}

// TestFormatsNameRulesAndLines: rules are named as the file spells their
// place, with their line; a policy's line is its name's.
func TestFormatsNameRulesAndLines(t *testing.T) {
	specs := parseFixture(t, "cnp-specs.yaml")
	require.Equal(t, 6, specs[0].Line)
	require.Equal(t, []string{"specs[0].egress[0]", "specs[0].egress[1]"}, ruleNames(specs[0].Egress))
	require.Equal(t, []int{11, 13}, ruleLines(specs[0].Egress))
	require.Equal(t, []string{"specs[1].ingress[0]"}, ruleNames(specs[0].Ingress))

	netpol := parseFixture(t, "networkpolicy.yaml")
	require.Equal(t, []string{"ingress[0]"}, ruleNames(netpol[0].Ingress))
	require.Equal(t, []string{"egress[0]", "egress[1]"}, ruleNames(netpol[0].Egress))
	require.Empty(t, netpol[1].Ingress, "policyTypes [Egress]: ingress is not the policy's")
}

func ruleNames(rules []policy.Rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.Name)
	}
	return out
}

func ruleLines(rules []policy.Rule) []int {
	var out []int
	for _, r := range rules {
		out = append(out, r.Line)
	}
	return out
}

// TestParseFullModel: deny rules, ranges, ICMP types, rules for every
// peer and enableDefaultDeny are read in full into the model.
func TestParseFullModel(t *testing.T) {
	content, err := os.ReadFile(filepath.Join("testdata", "formats", "everything.yaml"))
	require.NoError(t, err)
	policies, err := Parse("everything.yaml", content)
	require.NoError(t, err)
	require.Len(t, policies, 1)
	p := policies[0]
	require.Equal(t, "default/everything", p.Name, "a CiliumNetworkPolicy without namespace is in default, as kubectl applies it")
	require.Equal(t, []policy.Rule{
		{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("192.0.2.0/24")}},
			Ports: []policy.PortRange{
				{Protocol: policy.ProtocolTCP, Port: 8000, EndPort: 8100}, {Protocol: policy.ProtocolTCP, Port: 9000},
				{Protocol: policy.ProtocolUDP, Port: 9000}, {Protocol: policy.ProtocolSCTP, Port: 9000},
			},
			NoDefaultDeny: true, Name: "egress[0]", Line: 11, Column: 7},
		{AnyPeer: true, Ports: []policy.PortRange{{Protocol: policy.ProtocolICMP, Port: 8}, {Protocol: policy.ProtocolICMPv6, Port: 128}},
			NoDefaultDeny: true, Name: "egress[1]", Line: 13, Column: 7},
		{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}},
			NoDefaultDeny: true, Name: "egress[2]", Line: 14, Column: 7},
		{Deny: true, Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Except: prefixes("10.1.0.0/16")}},
			NoDefaultDeny: true, Name: "egressDeny[0]", Line: 16, Column: 7},
	}, p.Egress)
	require.Equal(t, []policy.Rule{
		{Deny: true, AnyPeer: true, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 22}}, Name: "ingressDeny[0]", Line: 18},
	}, withoutColumns(p.Ingress))
}

// TestNetworkPolicyKubernetesDefaults: the default policies of the
// Kubernetes documentation read with Kubernetes' semantics. A rule
// without peers and ports (Name "ingress"/"egress", no AnyPeer) allows
// nothing and isolates its direction; `- {}` allows every peer and port.
func TestNetworkPolicyKubernetesDefaults(t *testing.T) {
	isolate := func(dir string, line int) []policy.Rule { return []policy.Rule{{Name: dir, Line: line}} }
	allowAll := func(dir string, line int) []policy.Rule {
		return []policy.Rule{{AnyPeer: true, Name: dir + "[0]", Line: line}}
	}
	for _, tc := range []struct {
		name, spec      string
		ingress, egress []policy.Rule
	}{
		{"default deny ingress", "  podSelector: {}\n  policyTypes: [Ingress]\n", isolate("ingress", 6), nil},
		{"default deny ingress without policyTypes", "  podSelector: {}\n", isolate("ingress", 5), nil},
		{"allow all ingress", "  podSelector: {}\n  ingress:\n  - {}\n  policyTypes: [Ingress]\n", allowAll("ingress", 7), nil},
		{"default deny egress", "  podSelector: {}\n  policyTypes: [Egress]\n", nil, isolate("egress", 6)},
		{"allow all ingress, deny all egress", "  podSelector: {}\n  policyTypes: [Ingress, Egress]\n  ingress:\n  - {}\n  egress: []\n",
			allowAll("ingress", 8), isolate("egress", 6)},
		{"egress rules without policyTypes isolate ingress too", "  podSelector: {}\n  egress:\n  - {}\n",
			isolate("ingress", 5), allowAll("egress", 7)},
		{"no egress rules without policyTypes: egress is not the policy's", "  podSelector: {}\n  egress: []\n  ingress:\n  - {}\n",
			allowAll("ingress", 8), nil},
		{"ports without a port: every port of TCP (the default) or of the protocol", "  podSelector: {}\n  ingress:\n  - ports: [{}, {protocol: UDP}]\n",
			[]policy.Rule{{AnyPeer: true, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP}, {Protocol: policy.ProtocolUDP}}, Name: "ingress[0]", Line: 7}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			content := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec:\n" + tc.spec
			policies, err := Parse("p.yaml", []byte(content))
			require.NoError(t, err)
			require.Len(t, policies, 1)
			require.Equal(t, tc.ingress, withoutColumns(policies[0].Ingress), "ingress")
			require.Equal(t, tc.egress, withoutColumns(policies[0].Egress), "egress")
		})
	}
}
