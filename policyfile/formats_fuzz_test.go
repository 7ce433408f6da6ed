// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// FuzzParseCNP: CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy and
// List documents (seeded with the fixtures of testdata/formats) never
// panic the parser, and what it accepts holds checkParsedModel.
func FuzzParseCNP(f *testing.F) {
	for _, name := range []string{"cnp-spec.yaml", "cnp-specs.yaml", "ccnp.yaml", "list.yaml", "mixed.yaml", "everything.yaml", "native-cilium.yaml", "cnp-cilium.yaml", "ccnp-cilium.yaml", "list-cilium.yaml"} {
		addFixture(f, name)
	}
	f.Add([]byte(cnpHead + "spec:\n  egress:\n    - toEntities: [world, all]\n      icmps: [{fields: [{type: 8}]}]\n"))
	f.Add([]byte(ccnpHead + "specs:\n  - enableDefaultDeny: {ingress: true}\n    egress: [{toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}]}]\n"))
	f.Add([]byte(cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"80\", endPort: 90}], rules: {http: [{}]}}]\n"))
	f.Add([]byte(cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"0\", endPort: 1023, protocol: TCP}, {port: \"0\", endPort: 65535, protocol: UDP}]}]\n"))
	f.Add([]byte(cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{}, {matchLabels: {\"k8s:io.kubernetes.pod.namespace\": a}}, {matchLabels: {\"reserved:host\": \"\"}}]\n" +
		"      toPorts: [{ports: [{port: \"80\"}]}]\n  egress:\n    - toEntities: [cluster, remote-node, none]\n    - toEndpoints: [{matchExpressions: [{key: app, operator: NotIn, values: [a]}]}]\n"))
	f.Add([]byte(cnpHead + "spec:\n  egress:\n    - toFQDNs: [{matchName: api.example.com}, {matchPattern: \"*.example.com\"}]\n      toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n" +
		"    - toEndpoints: [{matchLabels: {k8s-app: kube-dns}}]\n      toPorts: [{ports: [{port: \"53\", protocol: ANY}], rules: {dns: [{matchPattern: \"*\"}]}}]\n"))
	f.Add([]byte(ccnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"53\", protocol: UDP}, {port: \"0\"}], rules: {dns: [{matchName: a.}, {}], http: [{}]}}]\n  egressDeny: [{toFQDNs: [{matchPattern: \"**\"}]}]\n"))
	f.Fuzz(fuzzParseFormats)
}

// FuzzParseNetworkPolicy: as FuzzParseCNP, for NetworkPolicy documents.
func FuzzParseNetworkPolicy(f *testing.F) {
	addFixture(f, "networkpolicy.yaml")
	f.Add([]byte(netpolHead + "spec:\n  podSelector: {}\n"))
	f.Add([]byte(netpolHead + "spec:\n  policyTypes: [Egress]\n  egress:\n    - to: [{ipBlock: {cidr: \"::/0\", except: [\"2001:db8::/32\"]}}]\n      ports: [{port: 80, endPort: 81, protocol: SCTP}, {protocol: UDP}]\n"))
	f.Add([]byte(netpolHead + "spec:\n  ingress:\n    - from: [{podSelector: {}}]\n      ports: [{port: http}]\n"))
	f.Add([]byte(netpolHead + "spec:\n  ingress:\n    - from: [{podSelector: {matchLabels: {app: a}}, namespaceSelector: {matchExpressions: [{key: team, operator: Exists}]}}, {namespaceSelector: {}}]\n"))
	f.Fuzz(fuzzParseFormats)
}

func addFixture(f *testing.F, name string) {
	content, err := os.ReadFile(filepath.Join("testdata", "formats", name))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(content)
}

func fuzzParseFormats(t *testing.T, data []byte) {
	policies, err := Parse("fuzz.yaml", data)
	if err != nil {
		var fileErr *FileError
		if !errors.As(err, &fileErr) || fileErr.File != "fuzz.yaml" || !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("error is not a *FileError of the file wrapping ErrInvalidPolicy: %v", err)
		}
		return
	}
	checkParsedModel(t, policies)
}

// checkParsedModel fails unless the policies hold the model's invariants:
// names unique and well-formed for their kind, prefixes the ipcache can
// key, excepts inside their CIDRs, ports sorted and distinct with a
// protocol (never "any"), ranges ordered, ICMP types without range, and
// every rule of a Kubernetes document named and placed.
func checkParsedModel(t *testing.T, policies []*policy.Policy) {
	t.Helper()
	names := map[string]bool{}
	for _, p := range policies {
		if p.Name == "" || names[p.Name] || p.File != "fuzz.yaml" || p.Line == 0 {
			t.Fatalf("policy %q: name repeated or empty, or file or line missing", p.Name)
		}
		names[p.Name] = true
		switch p.Kind {
		case policy.KindCNP, policy.KindNetworkPolicy:
			if !strings.Contains(p.Name, "/") {
				t.Fatalf("namespaced policy %q without namespace", p.Name)
			}
		case policy.KindCCNP, policy.KindNative:
			if strings.Contains(p.Name, "/") {
				t.Fatalf("policy %q of kind %s with a namespace", p.Name, p.Kind)
			}
		default:
			t.Fatalf("policy %q: kind %q", p.Name, p.Kind)
		}
		for _, dir := range policy.Directions() {
			for _, rule := range p.Rules(dir) {
				if p.Kind != policy.KindNative && (rule.Name == "" || rule.Line == 0) {
					t.Fatalf("policy %q: a rule without name or line: %+v", p.Name, rule)
				}
				for _, peer := range rule.Peers {
					checkPolicyPrefix(t, peer.CIDR)
					for _, except := range peer.Except {
						checkPolicyPrefix(t, except)
						if !prefixkey.Inside(peer.CIDR, except) {
							t.Fatalf("policy %q: except %s outside %s", p.Name, except, peer.CIDR)
						}
					}
				}
				checkFQDNRule(t, p.Name, dir, rule)
				if !slices.Equal(rule.Ports, sortPorts(slices.Clone(rule.Ports))) {
					t.Fatalf("policy %q %s: ports not sorted and distinct: %v", p.Name, rule.Name, rule.Ports)
				}
				for _, port := range rule.Ports {
					icmp := port.Protocol == policy.ProtocolICMP || port.Protocol == policy.ProtocolICMPv6
					switch {
					case port.Protocol == policy.ProtocolAny:
						t.Fatalf("policy %q %s: a port of any protocol", p.Name, rule.Name)
					case port.EndPort != 0 && (port.EndPort <= port.Port || icmp || port.EndPort == maxPortNumber && port.Port == 0):
						t.Fatalf("policy %q %s: range %v", p.Name, rule.Name, port)
					case icmp && port.Port > maxICMPType:
						t.Fatalf("policy %q %s: ICMP type %d", p.Name, rule.Name, port.Port)
					}
				}
			}
		}
	}
}

// checkFQDNRule fails unless a rule's toFQDNs and DNS rules hold the
// model's invariants: only in egress allow rules; selectors valid;
// toFQDNs the rule's only kind of peer and never every peer; DNS rules
// with valid names on single TCP or UDP ports the rule allows.
func checkFQDNRule(t *testing.T, name string, dir policy.Direction, rule policy.Rule) {
	t.Helper()
	f := rule.FQDN
	if f == nil {
		return
	}
	if dir != policy.Egress || rule.Deny || len(f.Selectors)+len(f.DNS) == 0 {
		t.Fatalf("policy %q %s: FQDN rule in %s (deny %v) or empty: %+v", name, rule.Name, dir, rule.Deny, f)
	}
	for _, sel := range f.Selectors {
		if err := sel.Validate(); err != nil {
			t.Fatalf("policy %q %s: toFQDNs %+v: %v", name, rule.Name, sel, err)
		}
	}
	if len(f.Selectors) > 0 && (rule.AnyPeer || len(rule.Peers)+len(rule.Endpoints)+len(rule.Entities) > 0) {
		t.Fatalf("policy %q %s: toFQDNs with another peer", name, rule.Name)
	}
	for _, dns := range f.DNS {
		if len(dns.Names) == 0 || len(dns.Ports) == 0 {
			t.Fatalf("policy %q %s: DNS rule without names or ports: %+v", name, rule.Name, dns)
		}
		for _, sel := range dns.Names {
			if err := sel.Validate(); err != nil {
				t.Fatalf("policy %q %s: dns %+v: %v", name, rule.Name, sel, err)
			}
		}
		for _, port := range dns.Ports {
			if port.Protocol != policy.ProtocolTCP && port.Protocol != policy.ProtocolUDP || port.Port == 0 || port.EndPort != 0 ||
				!slices.Contains(rule.Ports, port) {
				t.Fatalf("policy %q %s: DNS rule port %v", name, rule.Name, port)
			}
		}
	}
}
