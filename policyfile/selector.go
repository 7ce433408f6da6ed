// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The sources a Cilium selector's label key may name ("k8s:app",
// "any:app"): an endpoint's identity labels are k8s labels, and "any"
// (a key without source) matches them too.
var selectorSources = []string{"k8s", "any"}

// Kubernetes' bounds on a label key's name part and a label value, and on
// the key's prefix (a DNS subdomain).
const (
	maxLabelNameLength   = 63
	maxLabelPrefixLength = 253
)

// endpointSelector parses a label selector ({matchLabels,
// matchExpressions}; null or `{}` select everything) with Kubernetes'
// semantics. namespace restricts it to the endpoints of one namespace
// (empty: every namespace). ciliumKeys accepts Cilium's label keys with a
// source prefix ("k8s:app", "any:app"); the prefix is dropped.
func (p *parser) endpointSelector(n node, what, namespace string, ciliumKeys bool) (policy.EndpointSelector, error) {
	sel := policy.EndpointSelector{Namespace: namespace}
	if isNull(n) {
		return sel, nil
	}
	fields, err := p.fields(n, what, "matchLabels", "matchExpressions")
	if err != nil {
		return sel, err
	}
	if value, ok := fields.get("matchLabels"); ok && !isNull(value) {
		labelsWhat := what + ".matchLabels"
		if value.Kind() != mappingNode {
			return sel, p.errorf(value, "%s: want a mapping, got %s", labelsWhat, kindName(value))
		}
		for k, v := range value.Pairs() {
			key, err := p.labelKey(k, labelsWhat, ciliumKeys)
			if err != nil {
				return sel, err
			}
			val, err := p.labelValue(v, labelsWhat+"."+k.Value())
			if err != nil {
				return sel, err
			}
			if sel.MatchLabels == nil {
				sel.MatchLabels = map[string]string{}
			}
			if _, dup := sel.MatchLabels[key]; dup {
				return sel, p.errorf(k, "%s: label %q given twice", labelsWhat, key)
			}
			sel.MatchLabels[key] = val
		}
	}
	if value, ok := fields.get("matchExpressions"); ok {
		items, err := p.list(value, what+".matchExpressions")
		if err != nil {
			return sel, err
		}
		for i, item := range items {
			r, err := p.requirement(item, fmt.Sprintf("%s.matchExpressions[%d]", what, i), ciliumKeys)
			if err != nil {
				return sel, err
			}
			sel.MatchExpressions = append(sel.MatchExpressions, r)
		}
	}
	return sel, nil
}

// requirement parses one match expression: key, operator (In, NotIn,
// Exists, DoesNotExist) and values (required for In and NotIn, none for
// the others).
func (p *parser) requirement(n node, what string, ciliumKeys bool) (policy.Requirement, error) {
	fields, err := p.fields(n, what, "key", "operator", "values")
	if err != nil {
		return policy.Requirement{}, err
	}
	keyNode, ok := fields.get("key")
	if !ok {
		return policy.Requirement{}, p.errorf(n, "%s: key is required", what)
	}
	key, err := p.labelKey(keyNode, what+".key", ciliumKeys)
	if err != nil {
		return policy.Requirement{}, err
	}
	opNode, ok := fields.get("operator")
	if !ok {
		return policy.Requirement{}, p.errorf(n, "%s: operator is required (In, NotIn, Exists or DoesNotExist)", what)
	}
	op, err := p.scalar(opNode, what+".operator")
	if err != nil {
		return policy.Requirement{}, err
	}
	r := policy.Requirement{Key: key, Operator: policy.Operator(op)}
	switch r.Operator {
	case policy.OpIn, policy.OpNotIn, policy.OpExists, policy.OpDoesNotExist:
	default:
		return policy.Requirement{}, p.errorf(opNode, "%s.operator: %q: want In, NotIn, Exists or DoesNotExist", what, op)
	}
	r.Operator = policy.Operator(strings.Clone(op))
	valuesNode, hasValues := fields.get("values")
	if hasValues {
		items, err := p.list(valuesNode, what+".values")
		if err != nil {
			return policy.Requirement{}, err
		}
		for i, item := range items {
			v, err := p.labelValue(item, fmt.Sprintf("%s.values[%d]", what, i))
			if err != nil {
				return policy.Requirement{}, err
			}
			r.Values = append(r.Values, v)
		}
	}
	switch r.Operator {
	case policy.OpIn, policy.OpNotIn:
		if len(r.Values) == 0 {
			at := n
			if hasValues {
				at = valuesNode
			}
			return policy.Requirement{}, p.errorf(at, "%s.values: operator %s needs at least one value", what, op)
		}
	default:
		if len(r.Values) > 0 {
			return policy.Requirement{}, p.errorf(valuesNode, "%s.values: operator %s takes no values", what, op)
		}
	}
	slices.Sort(r.Values)
	r.Values = slices.Compact(r.Values)
	return r, nil
}

// labelKey parses a label key: a Kubernetes qualified name ("app",
// "app.kubernetes.io/name"), with ciliumKeys optionally behind a source
// ("k8s:app", "any:app"), which it drops.
func (p *parser) labelKey(n node, what string, ciliumKeys bool) (string, error) {
	s, err := p.scalar(n, what)
	if err != nil {
		return "", err
	}
	key := s
	if source, rest, ok := strings.Cut(s, ":"); ok && ciliumKeys {
		if !slices.Contains(selectorSources, source) {
			return "", p.errorf(n, "%s: %q: label source %q does not select endpoints: want k8s, any or none", what, s, source)
		}
		key = rest
	}
	if err := validateLabelKey(key); err != nil {
		return "", p.errorf(n, "%s: %q: %v", what, s, err)
	}
	return strings.Clone(key), nil
}

// labelValue parses a label value: empty, or up to 63 letters, digits,
// '-', '_' and '.', starting and ending with a letter or digit.
func (p *parser) labelValue(n node, what string) (string, error) {
	if n.Kind() != scalarNode || isNull(n) {
		return "", p.errorf(n, "%s: want a value, got %s", what, kindName(n))
	}
	v := n.Value()
	if v != "" {
		if err := validateLabelName(v); err != nil {
			return "", p.errorf(n, "%s: value %q: %v", what, v, err)
		}
	}
	return strings.Clone(v), nil
}

// validateLabelKey accepts a Kubernetes label key: an optional DNS
// subdomain prefix and '/', then a name (validateLabelName).
func validateLabelKey(key string) error {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if err := validateDNSName(prefix, maxLabelPrefixLength, true); err != nil {
			return fmt.Errorf("prefix: %v", err)
		}
		name = rest
	}
	if name == "" {
		return fmt.Errorf("name must not be empty")
	}
	return validateLabelName(name)
}

// validateLabelName accepts a label key's name or a non-empty label
// value: at most 63 letters, digits, '-', '_' and '.', starting and
// ending with a letter or digit.
func validateLabelName(s string) error {
	if len(s) > maxLabelNameLength {
		return fmt.Errorf("longer than %d characters", maxLabelNameLength)
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := range len(s) {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Errorf("character %q not allowed, want letters, digits, '-', '_' or '.'", c)
		}
	}
	if !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return fmt.Errorf("must start and end with a letter or digit")
	}
	return nil
}
