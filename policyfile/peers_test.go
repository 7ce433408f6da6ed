// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestLabelPeers: fromEndpoints/toEndpoints, NetworkPolicy podSelector and
// namespaceSelector peers and the entities read into the rule's
// Endpoints and Entities, with Cilium's and Kubernetes' namespace scoping.
func TestLabelPeers(t *testing.T) {
	const shopCNP = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p, namespace: shop}\n"
	const shopNetpol = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: shop}\n"
	tcp80 := []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 80}}
	world := []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}}
	for _, tc := range []struct {
		name, content string
		want          policy.Rule
	}{
		// CiliumNetworkPolicy: the policy's namespace unless the selector
		// names a namespace.
		{"CNP every endpoint of its namespace", shopCNP + "spec:\n  ingress:\n    - fromEndpoints: [{}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{Namespace: "shop"}}}},
		{"CNP null selector", shopCNP + "spec:\n  ingress:\n    - fromEndpoints: [~]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{Namespace: "shop"}}}},
		{"CNP labels, ports", shopCNP + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"k8s:app\": web}}, {matchLabels: {\"any:app\": api}}]\n" +
			"      toPorts: [{ports: [{port: \"80\", protocol: TCP}]}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{
				{Namespace: "shop", MatchLabels: map[string]string{"app": "web"}},
				{Namespace: "shop", MatchLabels: map[string]string{"app": "api"}}}, Ports: tcp80}},
		{"CNP names a namespace", shopCNP + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"k8s:io.kubernetes.pod.namespace\": other, app: web}}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"io.kubernetes.pod.namespace": "other", "app": "web"}}}}},
		{"CNP names namespaces by expression", shopCNP + "spec:\n  egress:\n    - toEndpoints: [{matchExpressions: [{key: \"any:io.kubernetes.pod.namespace\", operator: In, values: [a, b]}]}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{MatchExpressions: []policy.Requirement{
				{Key: "io.kubernetes.pod.namespace", Operator: policy.OpIn, Values: []string{"a", "b"}}}}}}},
		{"CNP names a namespace's label", shopCNP + "spec:\n  egress:\n    - toEndpoints: [{matchLabels: {\"k8s:io.cilium.k8s.namespace.labels.team\": a}}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"io.cilium.k8s.namespace.labels.team": "a"}}}}},
		{"CNP reserved label is the entity", shopCNP + "spec:\n  ingress:\n    - fromEndpoints: [{matchLabels: {\"reserved:host\": \"\"}, matchExpressions: []}, {matchLabels: {\"reserved:world\": \"\"}}, {}]\n",
			policy.Rule{Entities: []identity.Entity{identity.EntityHost}, Peers: world, Endpoints: []policy.EndpointSelector{{Namespace: "shop"}}}},
		// Clusterwide and native: no namespace restriction (only endpoint
		// identities are peers by label).
		{"CCNP every endpoint", ccnpHead + "spec:\n  egress:\n    - toEndpoints: [{}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{}}}},
		{"native labels", "name: a\negress:\n  - toEndpoints: [{matchLabels: {app: db}}]\n    toPorts: [{port: 80, protocol: TCP}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"app": "db"}}}, Ports: tcp80}},

		// Entities.
		{"entities", cnpHead + "spec:\n  egress:\n    - toEntities: [host, remote-node, host, cluster, kube-apiserver, health, init, ingress, unmanaged]\n",
			policy.Rule{Entities: []identity.Entity{identity.EntityHost, identity.EntityRemoteNode, identity.EntityCluster,
				identity.EntityKubeAPIServer, identity.EntityHealth, identity.EntityInit, identity.EntityIngress, identity.EntityUnmanaged}}},
		{"entities with world", ccnpHead + "spec:\n  egress:\n    - toEntities: [world, remote-node]\n      toPorts: [{ports: [{port: \"80\", protocol: TCP}]}]\n",
			policy.Rule{Peers: world, Entities: []identity.Entity{identity.EntityRemoteNode}, Ports: tcp80}},
		{"none selects nothing, even with ports", cnpHead + "spec:\n  egress:\n    - toEntities: [none]\n      toPorts: [{ports: [{port: \"80\", protocol: TCP}]}]\n",
			policy.Rule{Ports: tcp80}},
		{"native entities", "name: a\negress:\n  - toEntities: [cluster]\n", policy.Rule{Entities: []identity.Entity{identity.EntityCluster}}},

		// NetworkPolicy peers.
		{"podSelector: the policy's namespace", shopNetpol + "spec:\n  ingress:\n    - from: [{podSelector: {matchLabels: {app: web}}}]\n      ports: [{port: 80}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{Namespace: "shop", MatchLabels: map[string]string{"app": "web"}}}, Ports: tcp80}},
		{"empty podSelector", shopNetpol + "spec:\n  ingress:\n    - from: [{podSelector: {}}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{Namespace: "shop"}}}},
		{"namespaceSelector: namespaces by label", shopNetpol + "spec:\n  ingress:\n    - from: [{namespaceSelector: {matchLabels: {team: a}, matchExpressions: [{key: env, operator: NotIn, values: [dev]}]}}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"io.cilium.k8s.namespace.labels.team": "a"},
				MatchExpressions: []policy.Requirement{{Key: "io.cilium.k8s.namespace.labels.env", Operator: policy.OpNotIn, Values: []string{"dev"}}}}}}},
		{"empty namespaceSelector: every endpoint", shopNetpol + "spec:\n  ingress:\n    - from: [{namespaceSelector: {}}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{}}}},
		{"both in one peer", shopNetpol + "spec:\n  ingress:\n    - from: [{podSelector: {matchLabels: {app: web}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: front}}}]\n",
			policy.Rule{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"app": "web",
				"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "front"}}}}},
		{"both in two peers, and an ipBlock", shopNetpol + "spec:\n  ingress:\n    - from: [{podSelector: {matchLabels: {app: web}}}, {namespaceSelector: {matchLabels: {team: a}}}, {ipBlock: {cidr: 10.0.0.0/8}}]\n",
			policy.Rule{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}, Endpoints: []policy.EndpointSelector{
				{Namespace: "shop", MatchLabels: map[string]string{"app": "web"}},
				{MatchLabels: map[string]string{"io.cilium.k8s.namespace.labels.team": "a"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies, err := Parse("good.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Len(t, policies, 1)
			rules := clearRuleNames(append(policies[0].Ingress, policies[0].Egress...))
			require.Equal(t, []policy.Rule{tc.want}, rules)
		})
	}
}

// TestLabelPeersNativeErrors: the native format takes label peers and
// entities as Cilium does, each a rule's only kind of peer.
func TestLabelPeersNativeErrors(t *testing.T) {
	for _, tc := range []struct{ name, content, want string }{
		{"endpoints and CIDRs", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toEndpoints: [{}]\n",
			`bad.yaml:4:5: invalid policy file: policy "a": egress[0]: toCIDR and toEndpoints in one rule: as in Cilium, write two rules`},
		{"entities and endpoints", "name: a\ningress:\n  - fromEntities: [host]\n    fromEndpoints: [{}]\n",
			`bad.yaml:4:5: invalid policy file: policy "a": ingress[0]: fromEntities and fromEndpoints in one rule`},
		{"unknown entity", "name: a\negress:\n  - toEntities: [nodes]\n", `bad.yaml:3:18: invalid policy file: policy "a": egress[0].toEntities[0]: unknown entity "nodes"`},
		{"reserved expression", "name: a\negress:\n  - toEndpoints: [{matchExpressions: [{key: reserved:init, operator: DoesNotExist}]}]\n",
			`egress[0].toEndpoints[0].matchExpressions[0].key: "reserved:init": a reserved label selects its entity only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.content))
			require.ErrorIs(t, err, ErrInvalidPolicy)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// CIDRs and CIDR sets still share a rule in this format.
	policies, err := Parse("good.yaml", []byte("name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n    toCIDRSet: [{cidr: 11.0.0.0/8}]\n"))
	require.NoError(t, err)
	require.Len(t, policies[0].Egress[0].Peers, 2)
}
