// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/identity"
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

// Label keys that scope a peer selector to namespaces: a CNP's peer
// selector that names one of them selects in the namespaces it says,
// not in the policy's own (Cilium's getEndpointSelector).
const namespaceLabelsPrefix = "io.cilium.k8s.namespace.labels."

// endpointPeers parses fromEndpoints or toEndpoints (a list of label
// selectors) into rule: each selects endpoint identities (Endpoints),
// but a selector that is exactly one reserved label (`{matchLabels:
// {"reserved:host": ""}}`) selects that entity, as Cilium reads it.
// namespace is a CNP's: a selector that names neither the namespace label
// nor a namespace's label selects in it; empty (a CCNP's, a native
// policy's), selectors are not restricted.
func (p *parser) endpointPeers(n node, what, namespace string, rule *policy.Rule) error {
	items, err := p.nonEmptyList(n, what)
	if err != nil {
		return err
	}
	for i, item := range items {
		itemWhat := fmt.Sprintf("%s[%d]", what, i)
		entity, ok, err := p.reservedSelector(item, itemWhat)
		if err != nil {
			return err
		}
		if ok {
			addEntity(rule, entity)
			continue
		}
		sel, err := p.endpointSelector(item, itemWhat, "", true)
		if err != nil {
			return err
		}
		if namespace != "" && !namesNamespace(&sel) {
			sel.Namespace = namespace
		}
		rule.Endpoints = append(rule.Endpoints, sel)
	}
	return nil
}

// namesNamespace reports whether a selector names the namespace label or
// a namespace's label, in its labels or its expressions.
func namesNamespace(sel *policy.EndpointSelector) bool {
	names := func(key string) bool {
		return key == policy.NamespaceLabel || strings.HasPrefix(key, namespaceLabelsPrefix)
	}
	for key := range sel.MatchLabels {
		if names(key) {
			return true
		}
	}
	return slices.ContainsFunc(sel.MatchExpressions, func(r policy.Requirement) bool { return names(r.Key) })
}

// reservedSelector reads a peer selector with a key of source reserved:
// exactly one such label in matchLabels, with an empty value, and nothing
// else, is the entity it names (ok); any other use of a reserved key is
// an error. A selector without reserved keys is not ok and no error.
func (p *parser) reservedSelector(n node, what string) (identity.Entity, bool, error) {
	if n.Kind() != mappingNode {
		return "", false, nil
	}
	fields, err := p.fields(n, what, "matchLabels", "matchExpressions")
	if err != nil {
		return "", false, err
	}
	const usage = "a reserved label selects its entity only as the one label of a selector (`{matchLabels: {\"reserved:host\": \"\"}}`), or write the entity in toEntities/fromEntities"
	if value, ok := fields.get("matchExpressions"); ok && value.Kind() == sequenceNode {
		for i, item := range value.Items() {
			if item.Kind() != mappingNode {
				continue
			}
			for key, keyValue := range item.Pairs() {
				if key.Value() == "key" && strings.HasPrefix(keyValue.Value(), "reserved:") {
					return "", false, p.errorf(keyValue, "%s.matchExpressions[%d].key: %q: %s", what, i, keyValue.Value(), usage)
				}
			}
		}
	}
	labels, ok := fields.get("matchLabels")
	if !ok || labels.Kind() != mappingNode {
		return "", false, nil
	}
	var (
		entity string
		at     node
		count  int
	)
	for key, value := range labels.Pairs() {
		count++
		name, isReserved := strings.CutPrefix(key.Value(), "reserved:")
		if !isReserved {
			continue
		}
		if entity != "" {
			return "", false, p.errorf(key, "%s.matchLabels: %q: %s", what, key.Value(), usage)
		}
		entity, at = name, key
		if value.Kind() != scalarNode || value.Value() != "" {
			return "", false, p.errorf(value, "%s.matchLabels.%s: want \"\": reserved labels have no value", what, key.Value())
		}
	}
	if entity == "" {
		return "", false, nil
	}
	if exprs, ok := fields.get("matchExpressions"); count > 1 || ok && !isNull(exprs) && exprs.Len() > 0 {
		return "", false, p.errorf(at, "%s.matchLabels: %q: %s", what, at.Value(), usage)
	}
	e := identity.Entity(entity)
	if _, reserved := e.Reserved(); !reserved && e != identity.EntityWorld {
		return "", false, p.errorf(at, "%s.matchLabels: %q: no entity has this reserved label: want reserved:%s",
			what, at.Value(), strings.Join(reservedLabelEntities, ", reserved:"))
	}
	return e, true, nil
}

// reservedLabelEntities are the entities a reserved label in a peer
// selector may name, for errors.
var reservedLabelEntities = []string{"world", "host", "remote-node", "kube-apiserver", "health", "init", "ingress", "unmanaged"}
