// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"maps"
	"slices"
	"strings"
)

// Operator is the operator of a selector's match expression, as in
// Kubernetes' label selectors.
type Operator string

const (
	// OpIn matches a label whose value is one of the values.
	OpIn Operator = "In"
	// OpNotIn matches when the label is absent or its value is none of
	// the values.
	OpNotIn Operator = "NotIn"
	// OpExists matches when the label is present, whatever its value.
	OpExists Operator = "Exists"
	// OpDoesNotExist matches when the label is absent.
	OpDoesNotExist Operator = "DoesNotExist"
)

// Requirement is one match expression of a selector: a label key, an
// operator and, for In and NotIn, the values (at least one, sorted and
// distinct).
type Requirement struct {
	Key      string   `json:"key" yaml:"key"`
	Operator Operator `json:"operator" yaml:"operator"`
	Values   []string `json:"values,omitempty" yaml:"values,omitempty"`
}

// matches reports whether the requirement holds for the key-value pairs.
func (r Requirement) matches(kv map[string]string) bool {
	value, present := kv[r.Key]
	switch r.Operator {
	case OpIn:
		return present && slices.Contains(r.Values, value)
	case OpNotIn:
		return !present || !slices.Contains(r.Values, value)
	case OpExists:
		return present
	case OpDoesNotExist:
		return !present
	}
	return false
}

// String returns the requirement as kubectl writes it: "key in (a,b)",
// "key notin (a)", "key", "!key".
func (r Requirement) String() string {
	switch r.Operator {
	case OpIn:
		return r.Key + " in (" + strings.Join(r.Values, ",") + ")"
	case OpNotIn:
		return r.Key + " notin (" + strings.Join(r.Values, ",") + ")"
	case OpExists:
		return r.Key
	case OpDoesNotExist:
		return "!" + r.Key
	}
	return r.Key + " " + string(r.Operator)
}

// EndpointSelector picks the local endpoints a policy applies to by the
// labels of their identity, with Kubernetes' label selector semantics:
// every MatchLabels pair and every MatchExpressions requirement must hold.
// Keys are bare (a source prefix such as "k8s:" or "any:" is dropped when
// the policy is parsed): they match the identity's k8s labels, whose keys
// include the namespace label (NamespaceLabel) and the namespace's labels
// ("io.cilium.k8s.namespace.labels.<key>").
//
// Namespace, when set, restricts the selection to the endpoints of that
// namespace (a CiliumNetworkPolicy's or a NetworkPolicy's own); empty
// selects in every namespace. The zero value selects every endpoint.
type EndpointSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty" yaml:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty" yaml:"matchExpressions,omitempty"`
	Namespace        string            `json:"namespace,omitempty" yaml:"namespace,omitempty"`
}

// NamespaceLabel is the key of the label that carries an endpoint's
// namespace in its identity's label set, as in Cilium.
const NamespaceLabel = "io.kubernetes.pod.namespace"

// Empty reports whether the selector names no label: it selects every
// endpoint (of its namespace, if it has one) and, as the policy of the
// host-wide default, the traffic of no known endpoint.
func (s *EndpointSelector) Empty() bool {
	return len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0
}

// Matches reports whether the selector selects an endpoint whose identity
// has the k8s labels kv (key -> value, as endpoint.KeyValues gives them).
func (s *EndpointSelector) Matches(kv map[string]string) bool {
	if s.Namespace != "" && kv[NamespaceLabel] != s.Namespace {
		return false
	}
	for k, v := range s.MatchLabels {
		if have, ok := kv[k]; !ok || have != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		if !r.matches(kv) {
			return false
		}
	}
	return true
}

// SelectsPeer reports whether the selector, as a peer (fromEndpoints,
// toEndpoints), selects an identity whose labels have the k8s labels kv:
// only endpoint identities (those with a namespace label) are peers by
// label, so that `{}` in a clusterwide policy is every endpoint of the
// cluster, not every identity (as Cilium).
func (s *EndpointSelector) SelectsPeer(kv map[string]string) bool {
	if _, ok := kv[NamespaceLabel]; !ok {
		return false
	}
	return s.Matches(kv)
}

// Equal reports whether two selectors select the same way.
func (s *EndpointSelector) Equal(other *EndpointSelector) bool {
	return s.Namespace == other.Namespace && maps.Equal(s.MatchLabels, other.MatchLabels) &&
		slices.EqualFunc(s.MatchExpressions, other.MatchExpressions, func(a, b Requirement) bool {
			return a.Key == b.Key && a.Operator == b.Operator && slices.Equal(a.Values, b.Values)
		})
}

// String returns the selector as kubectl writes one ("app=web,tier in
// (a,b)"; "{}" when empty), prefixed by "namespace <ns>: " when
// namespaced.
func (s *EndpointSelector) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.MatchLabels)) {
		parts = append(parts, k+"="+s.MatchLabels[k])
	}
	for _, r := range s.MatchExpressions {
		parts = append(parts, r.String())
	}
	sel := "{}"
	if len(parts) > 0 {
		sel = strings.Join(parts, ",")
	}
	if s.Namespace != "" {
		return "namespace " + s.Namespace + ": " + sel
	}
	return sel
}
