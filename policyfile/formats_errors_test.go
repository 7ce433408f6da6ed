// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

const (
	cnpHead    = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p}\n"
	ccnpHead   = "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: p}\n"
	netpolHead = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\n"
)

// TestFormatsReject: whatever this agent cannot enforce, or does not
// know, rejects the whole file at its position, naming the field.
func TestFormatsReject(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		// Documents.
		{"unknown apiVersion", "apiVersion: cilium.io/v2alpha1\nkind: CiliumNetworkPolicy\n",
			`bad.yaml:1:1: invalid policy file: document: apiVersion "cilium.io/v2alpha1", kind "CiliumNetworkPolicy" is not a policy this agent reads`},
		{"other kind", "apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\n", `kind "CiliumCIDRGroup" is not a policy this agent reads`},
		{"kind without apiVersion", "kind: NetworkPolicy\nname: a\n", `bad.yaml:1:1: invalid policy file: document: apiVersion is required`},
		{"apiVersion misspelt", "apiversion: networking.k8s.io/v1\nkind: NetworkPolicy\n",
			`bad.yaml:1:1: invalid policy file: document: apiVersion is required (found "apiversion": keys are case-sensitive)`},
		{"kind misspelt", "apiVersion: networking.k8s.io/v1\nKind: NetworkPolicy\n",
			`bad.yaml:2:1: invalid policy file: document: kind is required (found "Kind": keys are case-sensitive)`},
		{"unknown top field", cnpHead + "spec: {egress: [{}]}\nextra: 1\n", `bad.yaml:5:1: invalid policy file: CiliumNetworkPolicy: unknown field "extra", want one of apiVersion, kind, metadata, spec, specs, status, description`},
		{"no metadata", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nspec: {}\n", `bad.yaml:1:1: invalid policy file: metadata is required`},
		{"no name", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {namespace: a}\n", `bad.yaml:3:11: invalid policy file: metadata.name is required`},
		{"bad name", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: Web}\n", `bad.yaml:3:18: invalid policy file: metadata.name: "Web": character 'W' not allowed`},
		{"bad namespace", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a, namespace: a.b}\n", `bad.yaml:3:32: invalid policy file: metadata.namespace: "a.b": character '.' not allowed`},
		{"unknown metadata", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a, nme: b}\n", `bad.yaml:3:21: invalid policy file: metadata: unknown field "nme"`},
		{"namespace of a clusterwide policy", "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: a, namespace: b}\n",
			`bad.yaml:3:32: invalid policy file: metadata.namespace: a cluster-wide policy has no namespace`},
		{"no spec", cnpHead, `bad.yaml:1:1: invalid policy file: policy "default/p": CiliumNetworkPolicy: spec or specs is required`},
		{"spec without rules", cnpHead + "spec: {endpointSelector: {}}\n", `bad.yaml:4:7: invalid policy file: policy "default/p": spec: no rules`},
		{"spec with empty rules", cnpHead + "spec: {egress: []}\n", `policy "default/p": spec: no rules`},
		{"null rules", cnpHead + "spec:\n  egress:\n", `bad.yaml:5:3: invalid policy file: policy "default/p": spec: no rules: at least one of ingress, ingressDeny, egress and egressDeny needs a rule`},
		{"null rules in specs", cnpHead + "specs:\n  - ingress: [{}]\n  - egress: null\n", `bad.yaml:6:5: invalid policy file: policy "default/p": specs[1]: no rules`},
		{"duplicate name", cnpHead + "spec: {egress: [{}]}\n---\n" + cnpHead + "spec: {egress: [{}]}\n", `bad.yaml:8:18: invalid policy file: name "default/p" is already used at line 3`},
		{"same name as native", ccnpHead + "spec: {egress: [{}]}\n---\nname: p\n", `bad.yaml:6:7: invalid policy file: name "p" is already used at line 3`},
		{"list in list", "apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: List\n    items: []\n",
			`bad.yaml:4:5: invalid policy file: items[0]: apiVersion "v1", kind "List" is not a policy this agent reads`},
		{"native item in list", "apiVersion: v1\nkind: List\nitems:\n  - name: a\n", `bad.yaml:4:5: invalid policy file: items[0]: apiVersion is required`},
		{"list without items", "apiVersion: v1\nkind: List\n", `bad.yaml:1:1: invalid policy file: List: items is required`},

		// Cilium specs.
		{"selector operator", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: Equals, values: [b]}]\n  egress: [{}]\n",
			`bad.yaml:6:43: invalid policy file: policy "default/p": spec.endpointSelector.matchExpressions[0].operator: "Equals": want In, NotIn, Exists or DoesNotExist`},
		{"selector In without values", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: In}]\n  egress: [{}]\n",
			`bad.yaml:6:24: invalid policy file: policy "default/p": spec.endpointSelector.matchExpressions[0].values: operator In needs at least one value`},
		{"selector NotIn with empty values", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: NotIn, values: []}]\n  egress: [{}]\n",
			`bad.yaml:6:58: invalid policy file: policy "default/p": spec.endpointSelector.matchExpressions[0].values: operator NotIn needs at least one value`},
		{"selector Exists with values", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: Exists, values: [b]}]\n  egress: [{}]\n",
			`bad.yaml:6:59: invalid policy file: policy "default/p": spec.endpointSelector.matchExpressions[0].values: operator Exists takes no values`},
		{"selector without operator", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a}]\n  egress: [{}]\n",
			`spec.endpointSelector.matchExpressions[0]: operator is required`},
		{"selector label key", cnpHead + "spec:\n  endpointSelector: {matchLabels: {\"a b\": web}}\n  egress: [{}]\n",
			`bad.yaml:5:36: invalid policy file: policy "default/p": spec.endpointSelector.matchLabels: "a b": character ' ' not allowed`},
		{"selector label key prefix", cnpHead + "spec:\n  endpointSelector: {matchLabels: {\"Example.com/app\": web}}\n  egress: [{}]\n",
			`spec.endpointSelector.matchLabels: "Example.com/app": prefix: "Example.com": character 'E' not allowed`},
		{"selector label source", cnpHead + "spec:\n  endpointSelector: {matchLabels: {\"reserved:host\": \"\"}}\n  egress: [{}]\n",
			`bad.yaml:5:36: invalid policy file: policy "default/p": spec.endpointSelector.matchLabels: "reserved:host": label source "reserved" does not select endpoints: want k8s, any or none`},
		{"selector label value", cnpHead + "spec:\n  endpointSelector: {matchLabels: {app: -web}}\n  egress: [{}]\n",
			`bad.yaml:5:41: invalid policy file: policy "default/p": spec.endpointSelector.matchLabels.app: value "-web": must start and end with a letter or digit`},
		{"selector expression value", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: In, values: [\"x/y\"]}]\n  egress: [{}]\n",
			`spec.endpointSelector.matchExpressions[0].values[0]: value "x/y": character '/' not allowed`},
		{"selector null label value", cnpHead + "spec:\n  endpointSelector: {matchLabels: {app: }}\n  egress: [{}]\n",
			`spec.endpointSelector.matchLabels.app: want a value, got nothing`},
		{"specs with different selectors", cnpHead + "specs:\n  - endpointSelector: {matchLabels: {app: a}}\n    egress: [{}]\n  - endpointSelector: {matchLabels: {app: b}}\n    egress: [{}]\n",
			`bad.yaml:7:23: invalid policy file: policy "default/p": specs[1].endpointSelector: namespace default: app=b differs from the first spec's namespace default: app=a: specs of one policy with different endpoint selectors are not supported`},
		{"nodeSelector", ccnpHead + "spec:\n  nodeSelector: {}\n  ingress: [{}]\n", `bad.yaml:5:3: invalid policy file: policy "p": spec.nodeSelector: host policies are not supported`},
		{"log", cnpHead + "spec:\n  log: {value: x}\n  ingress: [{}]\n", `bad.yaml:5:3: invalid policy file: policy "default/p": spec.log: policy logging is not supported`},
		{"specs place", cnpHead + "specs:\n  - egress: [{}]\n  - egress: [{toServices: [{k8sService: {serviceName: a}}]}]\n",
			`bad.yaml:6:15: invalid policy file: policy "default/p": specs[1].egress[0].toServices: selecting services is not supported`},
		{"enableDefaultDeny value", cnpHead + "spec:\n  egress: [{}]\n  enableDefaultDeny: {egress: maybe}\n", `bad.yaml:6:31: invalid policy file: policy "default/p": spec.enableDefaultDeny.egress: "maybe": want true or false`},

		// Cilium rules.
		{"fromRequires", cnpHead + "spec:\n  ingressDeny:\n    - fromRequires: [{}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.ingressDeny[0].fromRequires: not supported: write the labels into each fromEndpoints selector`},
		{"toRequires", cnpHead + "spec:\n  egress:\n    - toRequires: [{}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.egress[0].toRequires: not supported: write the labels into each toEndpoints selector`},
		{"empty toEndpoints", cnpHead + "spec:\n  egress:\n    - toEndpoints: []\n", `bad.yaml:6:20: invalid policy file: policy "default/p": spec.egress[0].toEndpoints: empty list, omit the field instead`},
		{"toEndpoints with toCIDR", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toEndpoints: [{}]\n",
			`bad.yaml:7:7: invalid policy file: policy "default/p": spec.egress[0]: toCIDR and toEndpoints in one rule: Cilium does not support combining them`},
		{"fromEndpoints with fromEntities", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{}]\n      fromEntities: [host]\n",
			`bad.yaml:7:7: invalid policy file: policy "default/p": spec.ingress[0]: fromEndpoints and fromEntities in one rule`},
		{"peer label source", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"cidr:10.0.0.0/8\": \"\"}}]\n",
			`bad.yaml:6:38: invalid policy file: policy "default/p": spec.ingress[0].fromEndpoints[0].matchLabels: "cidr:10.0.0.0/8": label source "cidr" does not select endpoints`},
		{"peer selector field", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabel: {app: a}}]\n",
			`bad.yaml:6:24: invalid policy file: policy "default/p": spec.ingress[0].fromEndpoints[0]: unknown field "matchLabel", want one of matchLabels, matchExpressions`},
		{"reserved label with another", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {app: a, \"reserved:host\": \"\"}}]\n",
			`bad.yaml:6:46: invalid policy file: policy "default/p": spec.ingress[0].fromEndpoints[0].matchLabels: "reserved:host": a reserved label selects its entity only as the one label of a selector`},
		{"two reserved labels", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"reserved:host\": \"\", \"reserved:health\": \"\"}}]\n",
			`spec.ingress[0].fromEndpoints[0].matchLabels: "reserved:health": a reserved label selects its entity only as the one label of a selector`},
		{"reserved label expression", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchExpressions: [{key: \"reserved:host\", operator: Exists}]}]\n",
			`bad.yaml:6:49: invalid policy file: policy "default/p": spec.ingress[0].fromEndpoints[0].matchExpressions[0].key: "reserved:host": a reserved label selects its entity only`},
		{"reserved label value", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"reserved:host\": yes}}]\n",
			`bad.yaml:6:55: invalid policy file: policy "default/p": spec.ingress[0].fromEndpoints[0].matchLabels.reserved:host: want "": reserved labels have no value`},
		{"reserved label no entity", cnpHead + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"reserved:cluster\": \"\"}}]\n",
			`bad.yaml:6:38: invalid policy file: policy "default/p": spec.ingress[0].fromEndpoints[0].matchLabels: "reserved:cluster": no entity has this reserved label: want reserved:world, reserved:host, reserved:remote-node`},
		{"toServices", cnpHead + "spec:\n  egress:\n    - toServices: [{k8sService: {serviceName: a}}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.egress[0].toServices: selecting services is not supported`},
		{"toGroups", cnpHead + "spec:\n  egress:\n    - toGroups: [{aws: {}}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.egress[0].toGroups: cloud provider groups are not supported`},
		{"fromGroups", cnpHead + "spec:\n  ingress:\n    - fromGroups: [{aws: {}}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.ingress[0].fromGroups: cloud provider groups are not supported`},
		{"toNodes", cnpHead + "spec:\n  egress:\n    - toNodes: [{}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.egress[0].toNodes: selecting nodes is not supported`},
		{"fromNodes", cnpHead + "spec:\n  ingress:\n    - fromNodes: [{}]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.ingress[0].fromNodes: selecting nodes is not supported`},
		{"authentication", cnpHead + "spec:\n  ingress:\n    - fromCIDR: [10.0.0.0/8]\n      authentication: {mode: required}\n",
			`bad.yaml:7:7: invalid policy file: policy "default/p": spec.ingress[0].authentication: mutual authentication is not supported`},
		{"unknown entity", cnpHead + "spec:\n  egress:\n    - toEntities: [world, clusters]\n",
			`bad.yaml:6:27: invalid policy file: policy "default/p": spec.egress[0].toEntities[1]: unknown entity "clusters": want all, world, cluster, host, remote-node, kube-apiserver, health, init, ingress, unmanaged, none`},
		{"world-ipv4", cnpHead + "spec:\n  egress:\n    - toEntities: [world-ipv4]\n",
			`bad.yaml:6:20: invalid policy file: policy "default/p": spec.egress[0].toEntities[0]: entity "world-ipv4" is not supported: this agent has one world identity (2) for both IP families`},
		{"world-ipv6", cnpHead + "spec:\n  egress:\n    - toEntities: [world-ipv6]\n", `spec.egress[0].toEntities[0]: entity "world-ipv6" is not supported`},
		{"unknown rule field", cnpHead + "spec:\n  egress:\n    - toCIDRs: [10.0.0.0/8]\n", `bad.yaml:6:7: invalid policy file: policy "default/p": spec.egress[0]: unknown field "toCIDRs"`},
		{"wrong direction field", cnpHead + "spec:\n  ingress:\n    - toCIDR: [10.0.0.0/8]\n", `spec.ingress[0]: unknown field "toCIDR"`},
		{"combined peers", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toCIDRSet: [{cidr: 11.0.0.0/8}]\n",
			`bad.yaml:7:7: invalid policy file: policy "default/p": spec.egress[0]: toCIDR and toCIDRSet in one rule: Cilium does not support combining them`},
		{"bare address in toCIDRSet", cnpHead + "spec:\n  egress:\n    - toCIDRSet: [{cidr: 10.0.1.32}]\n",
			`bad.yaml:6:26: invalid policy file: policy "default/p": spec.egress[0].toCIDRSet[0].cidr: "10.0.1.32" has no prefix length, which Cilium requires in a CIDR set: write 10.0.1.32/32`},
		{"bare address in except", ccnpHead + "spec:\n  ingress:\n    - fromCIDRSet: [{cidr: \"2001:db8::/32\", except: [\"2001:db8::1\"]}]\n",
			`bad.yaml:6:54: invalid policy file: policy "p": spec.ingress[0].fromCIDRSet[0].except[0]: "2001:db8::1" has no prefix length, which Cilium requires in a CIDR set: write 2001:db8::1/128`},
		{"bare address in ipBlock", netpolHead + "spec:\n  ingress:\n    - from: [{ipBlock: {cidr: 10.0.1.32}}]\n",
			`spec.ingress[0].from[0].ipBlock.cidr: "10.0.1.32" has no prefix length, which Kubernetes requires in a CIDR set: write 10.0.1.32/32`},
		{"cidrGroupRef", cnpHead + "spec:\n  egress:\n    - toCIDRSet: [{cidrGroupRef: g}]\n", `bad.yaml:6:20: invalid policy file: policy "default/p": spec.egress[0].toCIDRSet[0].cidrGroupRef: CIDR groups are not supported`},
		{"bad CIDR", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.1/33]\n", `bad.yaml:6:16: invalid policy file: policy "default/p": spec.egress[0].toCIDR[0]: "10.0.0.1/33" is not a CIDR`},
		{"L7 rules", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts:\n        - ports: [{port: \"80\", protocol: TCP}]\n          rules: {http: [{}]}\n",
			`bad.yaml:9:11: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].rules: L7 rules are not supported`},
		{"serverNames", cnpHead + "spec:\n  egress:\n    - toPorts:\n        - ports: [{port: \"443\", protocol: TCP}]\n          serverNames: [a.example]\n",
			`bad.yaml:8:11: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].serverNames: TLS server names are not supported`},
		{"listener", cnpHead + "spec:\n  egress:\n    - toPorts:\n        - listener: {name: l}\n", `bad.yaml:7:11: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].listener: L7 listeners are not supported`},
		{"terminatingTLS", cnpHead + "spec:\n  egress:\n    - toPorts:\n        - terminatingTLS: {}\n", `bad.yaml:7:11: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].terminatingTLS: TLS termination is not supported`},
		{"originatingTLS", cnpHead + "spec:\n  egress:\n    - toPorts:\n        - originatingTLS: {}\n", `bad.yaml:7:11: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].originatingTLS: TLS origination is not supported`},
		{"ports missing", cnpHead + "spec:\n  egress:\n    - toPorts: [{}]\n", `bad.yaml:6:17: invalid policy file: policy "default/p": spec.egress[0].toPorts[0]: ports is required`},
		{"named port", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: http}]}]\n", `bad.yaml:6:33: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0].port: "http": named ports are not supported`},
		{"port out of range", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"65536\"}]}]\n", `spec.egress[0].toPorts[0].ports[0].port: "65536" is not a port number (0..65535, decimal)`},
		{"hex port", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"0x50\"}]}]\n", `port: "0x50": named ports are not supported`},
		{"octal port", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"080\"}]}]\n", `port: "080" is not a port number`},
		{"endPort below port", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"80\", endPort: 79}]}]\n", `bad.yaml:6:48: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0].endPort: 79 is below port 80`},
		{"protocol", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"80\", protocol: ICMP}]}]\n", `bad.yaml:6:49: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0].protocol: "ICMP": want TCP, UDP, SCTP or ANY (ICMP goes in icmps)`},
		{"icmps with toPorts", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"80\"}]}]\n      icmps: [{fields: [{type: 8}]}]\n",
			`bad.yaml:7:14: invalid policy file: policy "default/p": spec.egress[0].icmps: icmps and toPorts in one rule`},
		{"icmp type name", cnpHead + "spec:\n  egress:\n    - icmps: [{fields: [{type: PacketTooBig}]}]\n", `bad.yaml:6:32: invalid policy file: policy "default/p": spec.egress[0].icmps[0].fields[0].type: "PacketTooBig" is not an ICMP type`},
		{"icmp family", cnpHead + "spec:\n  egress:\n    - icmps: [{fields: [{type: 8, family: IPv5}]}]\n", `spec.egress[0].icmps[0].fields[0].family: "IPv5": want IPv4 or IPv6`},
		{"icmp type range", cnpHead + "spec:\n  egress:\n    - icmps: [{fields: [{type: 256}]}]\n", `spec.egress[0].icmps[0].fields[0].type: "256" is not an ICMP type`},
		{"too many ports", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [" + strings.Repeat("{port: \"1\"}, ", 40) + "{port: \"1\"}]}]\n", `spec.egress[0].toPorts[0].ports: 41 ports, at most 40`},

		// NetworkPolicy.
		{"podSelector source", netpolHead + "spec:\n  podSelector: {matchLabels: {\"k8s:app\": web}}\n",
			`bad.yaml:5:31: invalid policy file: policy "networkpolicy/default/p": spec.podSelector.matchLabels: "k8s:app": character ':' not allowed`},
		{"podSelector operator", netpolHead + "spec:\n  podSelector: {matchExpressions: [{key: app, operator: in, values: [a]}]}\n",
			`bad.yaml:5:57: invalid policy file: policy "networkpolicy/default/p": spec.podSelector.matchExpressions[0].operator: "in": want In, NotIn, Exists or DoesNotExist`},
		{"ipBlock and namespaceSelector", netpolHead + "spec:\n  egress:\n    - to: [{ipBlock: {cidr: 10.0.0.0/8}, namespaceSelector: {}}]\n",
			`bad.yaml:6:12: invalid policy file: policy "networkpolicy/default/p": spec.egress[0].to[0]: ipBlock with podSelector or namespaceSelector in one peer: Kubernetes rejects it, write two peers`},
		{"ipBlock and podSelector", netpolHead + "spec:\n  egress:\n    - to: [{podSelector: {}, ipBlock: {cidr: 10.0.0.0/8}}]\n", `spec.egress[0].to[0]: ipBlock with podSelector`},
		{"empty peer", netpolHead + "spec:\n  ingress:\n    - from: [{}]\n", `bad.yaml:6:14: invalid policy file: policy "networkpolicy/default/p": spec.ingress[0].from[0]: a peer needs ipBlock, podSelector or namespaceSelector`},
		{"null selectors peer", netpolHead + "spec:\n  ingress:\n    - from: [{podSelector: null}]\n", `spec.ingress[0].from[0]: a peer needs ipBlock, podSelector or namespaceSelector`},
		{"namespaceSelector source", netpolHead + "spec:\n  ingress:\n    - from: [{namespaceSelector: {matchLabels: {\"k8s:team\": a}}}]\n",
			`bad.yaml:6:49: invalid policy file: policy "networkpolicy/default/p": spec.ingress[0].from[0].namespaceSelector.matchLabels: "k8s:team": character ':' not allowed`},
		{"ipBlock except outside", netpolHead + "spec:\n  ingress:\n    - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/8]}}]\n",
			`spec.ingress[0].from[0].ipBlock.except[0]: 11.0.0.0/8 is not inside 10.0.0.0/8`},
		{"ipBlock except equal to cidr", netpolHead + "spec:\n  ingress:\n    - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16, 10.0.0.0/8]}}]\n",
			`bad.yaml:6:65: invalid policy file: policy "networkpolicy/default/p": spec.ingress[0].from[0].ipBlock.except[1]: 10.0.0.0/8 is not a strict subset of cidr 10.0.0.0/8 (as Kubernetes requires)`},
		{"named NetworkPolicy port", netpolHead + "spec:\n  ingress:\n    - ports: [{port: https}]\n", `bad.yaml:6:22: invalid policy file: policy "networkpolicy/default/p": spec.ingress[0].ports[0].port: "https": named ports are not supported`},
		{"NetworkPolicy port zero", netpolHead + "spec:\n  ingress:\n    - ports: [{port: 0}]\n", `spec.ingress[0].ports[0].port: 0 is not a port (omit port for every port)`},
		{"NetworkPolicy protocol", netpolHead + "spec:\n  ingress:\n    - ports: [{port: 80, protocol: ANY}]\n", `spec.ingress[0].ports[0].protocol: "ANY": want TCP, UDP or SCTP`},
		// A quoted port is an IntOrString's string: a port name, which needs a letter.
		{"quoted NetworkPolicy port", netpolHead + "spec:\n  ingress:\n    - ports: [{port: \"80\"}]\n", `bad.yaml:6:22: invalid policy file: policy "networkpolicy/default/p": spec.ingress[0].ports[0].port: "80" is quoted, so Kubernetes reads it as a port name, which needs a letter`},
		{"quoted NetworkPolicy endPort", netpolHead + "spec:\n  ingress:\n    - ports: [{port: 80, endPort: '90'}]\n", `bad.yaml:6:35: invalid policy file: policy "networkpolicy/default/p": spec.ingress[0].ports[0].endPort: "90" is a string, endPort is an integer`},
		{"quoted endPort", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"80\", endPort: \"90\"}]}]\n", `bad.yaml:6:48: invalid policy file: policy "default/p": spec.egress[0].toPorts[0].ports[0].endPort: "90" is a string, endPort is an integer`},
		{"quoted enableDefaultDeny", cnpHead + "spec:\n  egress: [{}]\n  enableDefaultDeny: {egress: \"false\"}\n", `bad.yaml:6:31: invalid policy file: policy "default/p": spec.enableDefaultDeny.egress: "false": want true or false, not quoted`},
		{"NetworkPolicy endPort without port", netpolHead + "spec:\n  ingress:\n    - ports: [{endPort: 80}]\n", `spec.ingress[0].ports[0].endPort: needs a port to start from`},
		{"policyTypes", netpolHead + "spec:\n  policyTypes: [ingress]\n", `bad.yaml:5:17: invalid policy file: policy "networkpolicy/default/p": spec.policyTypes[0]: "ingress": want Ingress or Egress`},
		{"rules outside policyTypes", netpolHead + "spec:\n  policyTypes: [Ingress]\n  egress: [{}]\n", `bad.yaml:6:11: invalid policy file: policy "networkpolicy/default/p": spec.egress: rules given but policyTypes does not list Egress`},
		{"unknown NetworkPolicy field", netpolHead + "spec:\n  ingres: []\n", `bad.yaml:5:3: invalid policy file: policy "networkpolicy/default/p": spec: unknown field "ingres"`},
		{"null NetworkPolicy rules", netpolHead + "spec:\n  ingress:\n", `spec.ingress: no rules`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies, err := Parse("bad.yaml", []byte(tc.content))
			require.ErrorIs(t, err, ErrInvalidPolicy)
			require.ErrorContains(t, err, tc.want)
			var fileErr *FileError
			require.ErrorAs(t, err, &fileErr)
			require.NotZero(t, fileErr.Line, "the error has a position")
			require.NotZero(t, fileErr.Column, "the error has a column")
			require.Nil(t, policies, "the whole file is rejected")
		})
	}
}

// TestFormerlyGatedConstructsParse: deny rules, port ranges, ICMP types,
// rules for every peer and enableDefaultDeny false are accepted (the
// datapath enforces them) and read into the model.
func TestFormerlyGatedConstructsParse(t *testing.T) {
	cidr := []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}
	for _, tc := range []struct {
		name, content string
		dir           policy.Direction
		want          policy.Rule
	}{
		{"egressDeny", cnpHead + "spec:\n  egressDeny:\n    - toCIDR: [10.0.0.0/8]\n", policy.Egress,
			policy.Rule{Deny: true, Peers: cidr, Name: "egressDeny[0]", Line: 6}},
		{"endPort", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"8000\", endPort: 8080, protocol: TCP}]}]\n", policy.Egress,
			policy.Rule{Peers: cidr, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 8000, EndPort: 8080}}, Name: "egress[0]", Line: 6}},
		{"icmps", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      icmps: [{fields: [{type: EchoRequest}]}]\n", policy.Egress,
			policy.Rule{Peers: cidr, Ports: []policy.PortRange{{Protocol: policy.ProtocolICMP, Port: 8}}, Name: "egress[0]", Line: 6}},
		{"toPorts without peers", cnpHead + "spec:\n  egress:\n    - toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n", policy.Egress,
			policy.Rule{AnyPeer: true, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 443}}, Name: "egress[0]", Line: 6}},
		{"entity all", cnpHead + "spec:\n  ingress:\n    - fromEntities: [all]\n", policy.Ingress,
			policy.Rule{AnyPeer: true, Name: "ingress[0]", Line: 6}},
		{"NetworkPolicy allow all", netpolHead + "spec:\n  policyTypes: [Egress]\n  egress: [{}]\n", policy.Egress,
			policy.Rule{AnyPeer: true, Name: "egress[0]", Line: 6}},
		{"enableDefaultDeny false", cnpHead + "spec:\n  enableDefaultDeny: {ingress: false}\n  ingress:\n    - fromCIDR: [10.0.0.0/8]\n", policy.Ingress,
			policy.Rule{Peers: cidr, NoDefaultDeny: true, Name: "ingress[0]", Line: 7}},
		{"native deny, range, ICMP", "name: a\negressDeny:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 80, endPort: 90, protocol: TCP}]\n", policy.Egress,
			policy.Rule{Deny: true, Peers: cidr, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 80, EndPort: 90}}, Name: "egressDeny[0]", Line: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies, err := Parse("good.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Len(t, policies, 1)
			require.Equal(t, []policy.Rule{tc.want}, withoutColumns(policies[0].Rules(tc.dir)))
		})
	}
}

// TestGatePassesWhatIsEnforced: what the selectors and the policy map
// enforce today is not gated.
func TestGatePassesWhatIsEnforced(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		rules         []policy.Rule
	}{
		{"whole protocol", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"0\", protocol: SCTP}, {port: \"0\", protocol: TCP}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 6,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP}, {Protocol: policy.ProtocolSCTP}}}}},
		{"port 0 to endPort: ports 0..N", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"0\", endPort: 79, protocol: TCP}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 6,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, EndPort: 79}}}}},
		{"port 0 to 65535: every port", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"0\", endPort: 65535, protocol: UDP}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 6,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolUDP}}}}},
		{"endPort equal to port", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"80\", endPort: 80, protocol: TCP}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 6,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 80}}}}},
		{"world", cnpHead + "spec:\n  egress:\n    - toEntities: [world]\n      toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}},
				Name: "egress[0]", Line: 6, Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 443}}}}},
		{"enforce only", cnpHead + "spec:\n  egress: [{}]\n", []policy.Rule{{Name: "egress[0]", Line: 5}}},
		{"enableDefaultDeny true without rules", cnpHead + "spec:\n  ingress: [{}]\n  enableDefaultDeny: {egress: true}\n",
			[]policy.Rule{{Name: "enableDefaultDeny.egress", Line: 6}}},
		{"NetworkPolicy ingress isolated by default", netpolHead + "spec:\n  podSelector: {}\n", nil},
		{"NetworkPolicy egress []", netpolHead + "spec:\n  policyTypes: [Egress]\n  egress: []\n", []policy.Rule{{Name: "egress", Line: 5}}},
		{"NetworkPolicy port without number", netpolHead + "spec:\n  policyTypes: [Egress]\n  egress:\n    - to: [{ipBlock: {cidr: 10.0.0.0/8}}]\n      ports: [{protocol: UDP}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 7,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolUDP}}}}},
		{"SCTP port", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"9\", protocol: SCTP}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 6,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolSCTP, Port: 9}}}}},
		{"port without protocol (ANY)", cnpHead + "spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"53\"}]}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 6,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 53}, {Protocol: policy.ProtocolUDP, Port: 53}, {Protocol: policy.ProtocolSCTP, Port: 53}}}}},
		{"NetworkPolicy SCTP port", netpolHead + "spec:\n  policyTypes: [Egress]\n  egress:\n    - to: [{ipBlock: {cidr: 10.0.0.0/8}}]\n      ports: [{port: 9, protocol: SCTP}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 7,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolSCTP, Port: 9}}}}},
		{"native SCTP port", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 9, protocol: SCTP}, {port: 53}]\n",
			[]policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Name: "egress[0]", Line: 3,
				Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 53}, {Protocol: policy.ProtocolUDP, Port: 53}, {Protocol: policy.ProtocolSCTP, Port: 9}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies, err := Parse("good.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Len(t, policies, 1)
			require.Equal(t, tc.rules, withoutColumns(policies[0].Egress))
		})
	}
	// NetworkPolicy defaulting: Ingress always, Egress only with egress
	// rules; `ingress: []` is the same as none.
	for _, content := range []string{netpolHead + "spec: {podSelector: {}}\n", netpolHead + "spec: {ingress: [], egress: []}\n"} {
		policies, err := Parse("good.yaml", []byte(content))
		require.NoError(t, err)
		require.Equal(t, []policy.Rule{{Name: "ingress", Line: 4}}, policies[0].Ingress, "ingress isolated")
		require.Empty(t, policies[0].Egress, "egress not the policy's")
	}
}

// TestCiliumRuleFields: the fields a Cilium rule may have are the
// supported ones and the rejected ones, nothing else.
func TestCiliumRuleFields(t *testing.T) {
	for _, dir := range policy.Directions() {
		peer, unsupported := "to", ciliumEgressUnsupported
		if dir == policy.Ingress {
			peer, unsupported = "from", ciliumIngressUnsupported
		}
		want := []string{peer + "CIDR", peer + "CIDRSet", peer + "Entities", peer + "Endpoints", "toPorts", "icmps"}
		if dir == policy.Egress {
			want = append(want, "toFQDNs")
		}
		for name := range unsupported {
			want = append(want, name)
		}
		require.ElementsMatch(t, want, ciliumRuleFields[dir], dir.String())
	}
}
