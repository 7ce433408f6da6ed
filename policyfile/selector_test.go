// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestSelectors: each format's selector of the endpoints a policy applies
// to, with its namespace as Kubernetes and Cilium give it.
func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          policy.EndpointSelector
	}{
		{"CNP without selector: its namespace", cnpHead + "spec: {egress: [{}]}\n", policy.EndpointSelector{Namespace: "default"}},
		{"CNP empty selector", cnpHead + "spec: {endpointSelector: {}, egress: [{}]}\n", policy.EndpointSelector{Namespace: "default"}},
		{"CNP labels with sources", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p, namespace: shop}\n" +
			"spec:\n  endpointSelector:\n    matchLabels: {\"k8s:app\": web, \"any:tier\": front, role: x, \"app.kubernetes.io/name\": y}\n  egress: [{}]\n",
			policy.EndpointSelector{Namespace: "shop", MatchLabels: map[string]string{"app": "web", "tier": "front", "role": "x", "app.kubernetes.io/name": "y"}}},
		// Cilium replaces the namespace a CNP's selector names by its own.
		{"CNP namespace label", cnpHead + "spec:\n  endpointSelector: {matchLabels: {\"k8s:io.kubernetes.pod.namespace\": other, app: web}}\n  egress: [{}]\n",
			policy.EndpointSelector{Namespace: "default", MatchLabels: map[string]string{"app": "web"}}},
		{"CCNP namespace label", ccnpHead + "spec:\n  endpointSelector: {matchLabels: {\"k8s:io.kubernetes.pod.namespace\": shop}}\n  egress: [{}]\n",
			policy.EndpointSelector{MatchLabels: map[string]string{"io.kubernetes.pod.namespace": "shop"}}},
		{"CCNP expressions", ccnpHead + "spec:\n  endpointSelector:\n    matchExpressions:\n" +
			"      - {key: app, operator: In, values: [web, api, web]}\n      - {key: \"k8s:tier\", operator: NotIn, values: [db]}\n" +
			"      - {key: canary, operator: Exists}\n      - {key: legacy, operator: DoesNotExist}\n  egress: [{}]\n",
			policy.EndpointSelector{MatchExpressions: []policy.Requirement{
				{Key: "app", Operator: policy.OpIn, Values: []string{"api", "web"}},
				{Key: "tier", Operator: policy.OpNotIn, Values: []string{"db"}},
				{Key: "canary", Operator: policy.OpExists},
				{Key: "legacy", Operator: policy.OpDoesNotExist}}}},
		{"specs with one selector", cnpHead + "specs:\n  - endpointSelector: {matchLabels: {app: a}}\n    egress: [{}]\n" +
			"  - endpointSelector: {matchLabels: {\"k8s:app\": a}}\n    ingress: [{}]\n",
			policy.EndpointSelector{Namespace: "default", MatchLabels: map[string]string{"app": "a"}}},
		{"NetworkPolicy podSelector", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: shop}\n" +
			"spec:\n  podSelector:\n    matchLabels: {app: db}\n    matchExpressions: [{key: env, operator: In, values: [prod]}]\n",
			policy.EndpointSelector{Namespace: "shop", MatchLabels: map[string]string{"app": "db"},
				MatchExpressions: []policy.Requirement{{Key: "env", Operator: policy.OpIn, Values: []string{"prod"}}}}},
		{"NetworkPolicy empty podSelector", netpolHead + "spec: {podSelector: {}}\n", policy.EndpointSelector{Namespace: "default"}},
		{"native without selector: every endpoint", "name: a\negress: [{}]\n", policy.EndpointSelector{}},
		{"native selector", "name: a\nendpointSelector: {matchLabels: {\"k8s:app\": web}}\negress: [{}]\n",
			policy.EndpointSelector{MatchLabels: map[string]string{"app": "web"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policies, err := Parse("good.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Len(t, policies, 1)
			require.Equal(t, tc.want, policies[0].Selector)
		})
	}
}
