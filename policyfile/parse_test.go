// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func TestParseMultiDocument(t *testing.T) {
	content := `
# The example of docs/CONTRACT.md, "Format".
name: allow-dns-and-web
egress:
  - toCIDR: ["10.96.0.0/12", "192.0.2.10/32"]
    toPorts: [{port: 53, protocol: UDP}]
  - toCIDRSet:
      - cidr: 0.0.0.0/0
        except: ["10.0.0.0/8"]
ingress:
  - fromCIDR: ["203.0.113.0/24", "2001:db8::/32"]
---
---
# An empty document above is skipped.
name: ports
ingress:
  - fromCIDRSet: [{cidr: 192.0.2.1}]
    toPorts:
      - {port: "443", protocol: TCP}
      - {port: 53}
      - {port: 53, protocol: UDP}
egress:
  - {}
`
	policies, err := Parse("p.yaml", []byte(content))
	require.NoError(t, err)
	require.Len(t, policies, 2)

	dns := policies[0]
	require.Equal(t, "allow-dns-and-web", dns.Name)
	require.Equal(t, "p.yaml", dns.File)
	require.Equal(t, 3, dns.Line)
	require.Equal(t, []policy.Rule{{
		Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("203.0.113.0/24")}, {CIDR: netip.MustParsePrefix("2001:db8::/32")}},
	}}, clearRuleNames(dns.Ingress))
	require.Equal(t, []string{"ingress[0]"}, ruleNames(dns.Ingress))
	require.Equal(t, []int{11}, ruleLines(dns.Ingress))
	require.Equal(t, []policy.Rule{
		{
			Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.96.0.0/12")}, {CIDR: netip.MustParsePrefix("192.0.2.10/32")}},
			Ports: []policy.PortRange{{Port: 53, Protocol: policy.ProtocolUDP}},
		},
		{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Except: prefixes("10.0.0.0/8")}}},
	}, clearRuleNames(dns.Egress))
	require.Equal(t, prefixes("0.0.0.0/0", "10.0.0.0/8", "10.96.0.0/12", "192.0.2.10/32", "203.0.113.0/24", "2001:db8::/32"),
		dns.Prefixes())

	ports := policies[1]
	require.Equal(t, 15, ports.Line)
	require.Equal(t, []policy.Rule{{
		Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("192.0.2.1/32")}},
		// Sorted, distinct; a port without protocol is TCP and UDP.
		Ports: []policy.PortRange{{Port: 53, Protocol: policy.ProtocolTCP}, {Port: 443, Protocol: policy.ProtocolTCP}, {Port: 53, Protocol: policy.ProtocolUDP}},
	}}, clearRuleNames(ports.Ingress))
	require.Equal(t, []policy.Rule{{}}, clearRuleNames(ports.Egress), "an empty rule selects nothing: it only enforces the direction")
}

func TestParseEmptyFile(t *testing.T) {
	for _, content := range []string{"", "# nothing\n", "---\n---\n"} {
		policies, err := Parse("empty.yaml", []byte(content))
		require.NoError(t, err, "%q", content)
		require.Empty(t, policies)
	}
}

// TestParseErrors checks that each kind of error rejects the file and
// names the file and the position.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"syntax", "name: a\negress: [\n", `bad.yaml:3:1: invalid policy file: YAML: unterminated flow collection: the file ends before its closing bracket`},
		{"tab", "name: a\n\tegress: []\n", `bad.yaml:2:1: invalid policy file: YAML: tab character where indentation is read: indent with spaces`},
		{"not a mapping", "- name: a\n", `bad.yaml:1:1: invalid policy file: policy: want a mapping, got a list`},
		{"unknown field", "name: a\nspec: {}\n", `bad.yaml:2:1: invalid policy file: policy: unknown field "spec", want one of name, endpointSelector, ingress, ingressDeny, egress, egressDeny, enableDefaultDeny`},
		{"repeated field", "name: a\nname: b\n", `bad.yaml:2:1: invalid policy file: YAML: mapping key "name" given twice (first at line 1)`},
		{"missing name", "egress: []\n", `bad.yaml:1:1: invalid policy file: policy: name is required`},
		{"null name", "name:\n", `bad.yaml:1:6: invalid policy file: name: want a value, got nothing`},
		{"empty name", "name: ''\n", `bad.yaml:1:7: invalid policy file: name: must not be empty`},
		{"bad name", "name: a/b\n", `bad.yaml:1:7: invalid policy file: name: "a/b": character '/' not allowed`},
		{"name edge", "name: -a\n", `bad.yaml:1:7: invalid policy file: name: "-a" must start and end with a letter or digit`},
		{"name list", "name: [a]\n", `bad.yaml:1:7: invalid policy file: name: want a value, got a list`},
		{"duplicate name", "name: a\n---\nname: b\n---\nname: a\n",
			`bad.yaml:5:7: invalid policy file: name "a" is already used at line 1`},
		{"rules not a list", "name: a\negress: {}\n", `bad.yaml:2:9: invalid policy file: policy "a": egress: want a list, got a mapping`},
		{"rule not a mapping", "name: a\negress: [x]\n", `bad.yaml:2:10: invalid policy file: policy "a": egress[0]: want a mapping, got "x"`},
		{"wrong direction field", "name: a\ningress:\n  - toCIDR: [10.0.0.0/8]\n",
			`bad.yaml:3:5: invalid policy file: policy "a": ingress[0]: unknown field "toCIDR", want one of fromCIDR, fromCIDRSet, toPorts`},
		{"bad CIDR", "name: a\negress:\n  - toCIDR: [10.0.0.0/8, 10.0.0.300/24]\n",
			`bad.yaml:3:26: invalid policy file: policy "a": egress[0].toCIDR[1]: "10.0.0.300/24" is not a CIDR`},
		{"CIDR not a string", "name: a\negress:\n  - toCIDR: [[10.0.0.0/8]]\n",
			`bad.yaml:3:14: invalid policy file: policy "a": egress[0].toCIDR[0]: want a value, got a list`},
		{"zone", "name: a\negress:\n  - toCIDR: [\"fe80::1%eth0\"]\n",
			`bad.yaml:3:14: invalid policy file: policy "a": egress[0].toCIDR[0]: "fe80::1%eth0": zones are not allowed`},
		{"4in6", "name: a\negress:\n  - toCIDR: [\"::ffff:10.0.0.0/104\"]\n",
			`egress[0].toCIDR[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 prefix, write it as IPv4`},
		{"empty CIDR list", "name: a\negress:\n  - toCIDR: []\n",
			`bad.yaml:3:13: invalid policy file: policy "a": egress[0].toCIDR: empty list, omit the field instead`},
		{"cidr set unknown field", "name: a\negress:\n  - toCIDRSet: [{cidr: 10.0.0.0/8, excpt: [10.1.0.0/16]}]\n",
			`bad.yaml:3:36: invalid policy file: policy "a": egress[0].toCIDRSet[0]: unknown field "excpt", want one of cidr, except`},
		{"cidr set without cidr", "name: a\negress:\n  - toCIDRSet: [{except: [10.1.0.0/16]}]\n",
			`bad.yaml:3:17: invalid policy file: policy "a": egress[0].toCIDRSet[0]: cidr is required`},
		{"except outside", "name: a\negress:\n  - toCIDRSet: [{cidr: 10.0.0.0/8, except: [11.0.0.0/16]}]\n",
			`bad.yaml:3:45: invalid policy file: policy "a": egress[0].toCIDRSet[0].except[0]: 11.0.0.0/16 is not inside 10.0.0.0/8`},
		{"except wider", "name: a\negress:\n  - toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.0.0.0/7]}]\n",
			`except[0]: 10.0.0.0/7 is not inside 10.0.0.0/8`},
		{"except other family", "name: a\negress:\n  - toCIDRSet: [{cidr: 0.0.0.0/0, except: [\"::/0\"]}]\n",
			`except[0]: ::/0 is not inside 0.0.0.0/0`},
		{"ports and icmps", "name: a\negress:\n  - toPorts: [{port: 80}]\n    icmps: [{fields: [{type: 8}]}]\n",
			`bad.yaml:4:12: invalid policy file: policy "a": egress[0].icmps: icmps and toPorts in one rule`},
		{"endPort below port", "name: a\negress:\n  - toPorts: [{port: 80, endPort: 79}]\n",
			`bad.yaml:3:35: invalid policy file: policy "a": egress[0].toPorts[0].endPort: 79 is below port 80`},
		{"enableDefaultDeny unknown direction", "name: a\negress: [{}]\nenableDefaultDeny: {egres: false}\n",
			`bad.yaml:3:21: invalid policy file: policy "a": enableDefaultDeny: unknown field "egres"`},
		{"null deny rules", "name: a\negressDeny:\n", `egressDeny: no rules (write`},
		{"empty ports", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: []\n",
			`bad.yaml:4:14: invalid policy file: policy "a": egress[0].toPorts: empty list, omit the field instead`},
		{"port zero", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 0}]\n",
			`bad.yaml:4:22: invalid policy file: policy "a": egress[0].toPorts[0].port: "0" is not a port number (1..65535)`},
		{"port too large", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 65536}]\n",
			`bad.yaml:4:22: invalid policy file: policy "a": egress[0].toPorts[0].port: "65536" is not a port number (1..65535)`},
		{"named port", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: http}]\n",
			`egress[0].toPorts[0].port: "http" is not a port number (1..65535)`},
		{"port missing", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{protocol: TCP}]\n",
			`bad.yaml:4:15: invalid policy file: policy "a": egress[0].toPorts[0]: port is required`},
		{"bad protocol", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 80, protocol: ICMP}]\n",
			`bad.yaml:4:36: invalid policy file: policy "a": egress[0].toPorts[0].protocol: "ICMP": want TCP, UDP or SCTP (omit it for TCP and UDP)`},
		{"lower-case protocol", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 80, protocol: tcp}]\n",
			`egress[0].toPorts[0].protocol: "tcp": want TCP, UDP or SCTP`},
		{"port unknown field", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 80, end: 90}]\n",
			`bad.yaml:4:26: invalid policy file: policy "a": egress[0].toPorts[0]: unknown field "end", want one of port, endPort, protocol`},
		{"alias", "name: a\negress:\n  - toCIDR: &nets [10.0.0.0/8]\n  - toCIDR: *nets\n",
			`bad.yaml:3:13: invalid policy file: YAML: anchors (&) and aliases are not supported`},
		{"error in second document", "name: a\n---\nname: b\negress: [{toCIDR: [x]}]\n",
			`bad.yaml:4:20: invalid policy file: policy "b": egress[0].toCIDR[0]: "x" is not a CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies, err := Parse("bad.yaml", []byte(tc.content))
			require.ErrorIs(t, err, ErrInvalidPolicy)
			require.ErrorContains(t, err, tc.want)
			var fileErr *FileError
			require.ErrorAs(t, err, &fileErr)
			require.Equal(t, "bad.yaml", fileErr.File)
			require.NotZero(t, fileErr.Line, "the error has a position")
			require.Nil(t, policies, "the whole file is rejected")
		})
	}
}

// TestParseHostBits: a CIDR with host bits set is read as its prefix, as
// Cilium and Kubernetes read it, with a warning at its position (once,
// though an ipBlock's except is read twice).
func TestParseHostBits(t *testing.T) {
	content := "name: a\negress:\n  - toCIDR: [10.0.0.5/8]\n---\n" + cnpHead +
		"spec:\n  ingress:\n    - fromCIDRSet: [{cidr: \"2001:db8::1/48\", except: [\"2001:db8:0:1::1/64\"]}]\n---\n" + netpolHead +
		"spec:\n  ingress:\n    - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.2.3/16]}}]\n"
	parsed, err := ParseFile("p.yaml", []byte(content))
	require.NoError(t, err)
	require.Equal(t, prefixes("10.0.0.0/8"), parsed.Policies[0].Prefixes())
	require.Equal(t, []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("2001:db8::/48"), Except: prefixes("2001:db8:0:1::/64")}},
		parsed.Policies[1].Ingress[0].Peers)
	require.Equal(t, []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Except: prefixes("10.1.0.0/16")}},
		parsed.Policies[2].Ingress[0].Peers)
	var warnings []string
	for _, w := range parsed.Warnings {
		warnings = append(warnings, w.String())
	}
	require.Equal(t, []string{
		`p.yaml:3:14: policy "a": egress[0].toCIDR[0]: "10.0.0.5/8": host bits set, read as 10.0.0.0/8`,
		`p.yaml:10:28: policy "default/p": spec.ingress[0].fromCIDRSet[0].cidr: "2001:db8::1/48": host bits set, read as 2001:db8::/48`,
		`p.yaml:10:55: policy "default/p": spec.ingress[0].fromCIDRSet[0].except[0]: "2001:db8:0:1::1/64": host bits set, read as 2001:db8:0:1::/64`,
		`p.yaml:17:52: policy "networkpolicy/default/p": spec.ingress[0].from[0].ipBlock.except[0]: "10.1.2.3/16": host bits set, read as 10.1.0.0/16`,
	}, warnings)

	parsed, err = ParseFile("p.yaml", []byte("name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n"))
	require.NoError(t, err)
	require.Empty(t, parsed.Warnings, "no warning for a CIDR as written")
}

// TestParseCiliumAsTheAPIServer: what Cilium's API server keeps of a
// policy: a description beside spec is pruned, a null rule list is no
// rules (as absent).
func TestParseCiliumAsTheAPIServer(t *testing.T) {
	content := cnpHead + "description: what it does\nspec:\n  egress: null\n  ingressDeny:\n  ingress:\n    - fromCIDR: [10.0.0.0/8]\n---\n" +
		ccnpHead + "description: {a: b}\nspecs:\n  - egress: [{}]\n    ingress: ~\n"
	policies, err := Parse("p.yaml", []byte(content))
	require.NoError(t, err)
	require.Len(t, policies, 2)
	require.Empty(t, policies[0].Egress)
	require.Equal(t, []policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}}},
		clearRuleNames(policies[0].Ingress))
	require.Empty(t, policies[1].Ingress)
	require.Len(t, policies[1].Egress, 1)
}

func TestParseBareAddresses(t *testing.T) {
	policies, err := Parse("p.yaml", []byte("name: a\negress:\n  - toCIDR: [192.0.2.1, \"2001:db8::1\"]\n"))
	require.NoError(t, err)
	require.Equal(t, prefixes("192.0.2.1/32", "2001:db8::1/128"), policies[0].Prefixes())

	// In a CNP's CIDR list too (a CIDR set needs a prefix length there);
	// the native format's CIDR sets take them as they always did.
	policies, err = Parse("p.yaml", []byte(cnpHead+"spec:\n  ingress:\n    - fromCIDR: [10.0.1.32]\n---\nname: n\negress:\n  - toCIDRSet: [{cidr: 10.0.1.33}]\n"))
	require.NoError(t, err)
	require.Equal(t, prefixes("10.0.1.32/32"), policies[0].Prefixes())
	require.Equal(t, prefixes("10.0.1.33/32"), policies[1].Prefixes())
}

// TestParseCutMidWrite: a file cut at a line boundary while an editor
// rewrites it in place is rejected wherever the cut leaves a rule list key
// without its value or a rule without its CIDRs, so the version before
// stays in force; `egress: []` is still a policy with no rules.
func TestParseCutMidWrite(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"after egress", "name: e2e\negress:\n", `bad.yaml:2:8: invalid policy file: policy "e2e": egress: no rules (write ` + "`egress: []`" + ` for none)`},
		{"after ingress", "name: e2e\ningress:\n", `bad.yaml:2:9: invalid policy file: policy "e2e": ingress: no rules (write ` + "`ingress: []`" + ` for none)`},
		{"after egress, second document", "name: a\negress: []\n---\nname: e2e\negress:\n", `bad.yaml:5:8: invalid policy file: policy "e2e": egress: no rules`},
		{"explicit null", "name: e2e\negress: null\n", `policy "e2e": egress: no rules`},
		{"after the item marker", "name: e2e\negress:\n  -\n", `bad.yaml:3:4: invalid policy file: policy "e2e": egress[0]: want a mapping, got nothing`},
		{"after toCIDR", "name: e2e\negress:\n  - toCIDR:\n", `policy "e2e": egress[0].toCIDR: empty list, omit the field instead`},
		{"mid flow toCIDR list", "name: e2e\negress:\n  - toCIDR: [10.0.0.0/8,\n", `invalid policy file: YAML: unterminated flow collection`},
		{"after toCIDRSet", "name: e2e\negress:\n  - toCIDRSet:\n", `policy "e2e": egress[0].toCIDRSet: empty list, omit the field instead`},
		{"after cidr", "name: e2e\negress:\n  - toCIDRSet:\n    - cidr:\n", `egress[0].toCIDRSet[0].cidr: want a value, got nothing`},
		{"after except", "name: e2e\negress:\n  - toCIDRSet:\n    - cidr: 10.0.0.0/8\n      except:\n", `egress[0].toCIDRSet[0].except: empty list, omit the field instead`},
		{"after toPorts", "name: e2e\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts:\n", `egress[0].toPorts: empty list, omit the field instead`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.content))
			require.ErrorIs(t, err, ErrInvalidPolicy)
			require.ErrorContains(t, err, tc.want)
		})
	}
	policies, err := Parse("a.yaml", []byte("name: e2e\negress: []\ningress: []\n"))
	require.NoError(t, err)
	require.Len(t, policies, 1)
	require.Empty(t, policies[0].Egress)
	require.Empty(t, policies[0].Ingress)

	// Every cut of a file whose lists are on one line each is rejected,
	// but the one before the rules (a policy without rules fields, which
	// no value can tell from one written that way).
	full := "name: e2e\negress:\n  - toCIDR: [10.0.0.0/8, 192.0.2.1]\n    toPorts: [{port: 53, protocol: UDP}]\ningress:\n  - fromCIDR: [203.0.113.0/24]\n"
	for i := range len(full) {
		if i == 0 || full[i-1] != '\n' {
			continue
		}
		cut := full[:i]
		_, err := Parse("a.yaml", []byte(cut))
		if cut == "name: e2e\n" || cut == "name: e2e\negress:\n  - toCIDR: [10.0.0.0/8, 192.0.2.1]\n" ||
			cut == "name: e2e\negress:\n  - toCIDR: [10.0.0.0/8, 192.0.2.1]\n    toPorts: [{port: 53, protocol: UDP}]\n" {
			// A cut between whole rules or fields: a valid policy.
			require.NoError(t, err, "%q", cut)
			continue
		}
		require.ErrorIs(t, err, ErrInvalidPolicy, "%q", cut)
	}
}
