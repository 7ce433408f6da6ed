// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The API versions of the Kubernetes documents a policy file may hold
// (docs/CONTRACT.md, "Policy file formats").
const (
	apiVersionCilium        = "cilium.io/v2"
	apiVersionNetworkPolicy = "networking.k8s.io/v1"
	apiVersionList          = "v1"
	kindList                = "List"
)

// ignoredMetadata are the metadata fields Kubernetes sets or allows that
// say nothing about what a policy enforces: accepted and ignored, so that
// `kubectl get -o yaml` output reads as it is.
var ignoredMetadata = []string{"labels", "annotations", "uid", "resourceVersion", "creationTimestamp",
	"generation", "managedFields", "generateName", "selfLink", "deletionTimestamp",
	"deletionGracePeriodSeconds", "ownerReferences", "finalizers"}

// isKubernetesDocument reports whether a document is a Kubernetes object
// (it has apiVersion or kind) rather than a native policy.
func isKubernetesDocument(n node) bool {
	for key := range n.Pairs() {
		if key.Kind() == scalarNode && (key.Value() == "apiVersion" || key.Value() == "kind") {
			return true
		}
	}
	return false
}

// kubernetesDocument parses a Kubernetes object: a CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy, NetworkPolicy, or a List of them.
// inList is the place of an item in a List ("" at the top).
func (p *parser) kubernetesDocument(n node, inList string) ([]*policy.Policy, error) {
	p.current = ""
	apiVersion, kind, err := p.typeMeta(n, inList)
	if err != nil {
		return nil, err
	}
	switch {
	case apiVersion == apiVersionCilium && (kind == policy.KindCNP || kind == policy.KindCCNP):
		pol, err := p.ciliumPolicy(n, kind)
		return []*policy.Policy{pol}, err
	case apiVersion == apiVersionNetworkPolicy && kind == policy.KindNetworkPolicy:
		pol, err := p.networkPolicy(n)
		return []*policy.Policy{pol}, err
	case apiVersion == apiVersionList && kind == kindList && inList == "":
		return p.kubernetesList(n)
	}
	what := "document"
	if inList != "" {
		what = inList
	}
	return nil, p.errorf(n, "%s: apiVersion %q, kind %q is not a policy this agent reads: want %s %s or %s, %s %s, or %s %s",
		what, apiVersion, kind, apiVersionCilium, policy.KindCNP, policy.KindCCNP, apiVersionNetworkPolicy, policy.KindNetworkPolicy,
		apiVersionList, kindList)
}

// typeMeta returns a document's apiVersion and kind, both required.
func (p *parser) typeMeta(n node, where string) (apiVersion, kind string, err error) {
	if n.Kind() != mappingNode {
		return "", "", p.errorf(n, "%s: want a mapping, got %s", orDocument(where), kindName(n))
	}
	var (
		found [2]node
		given [2]bool
	)
	for key, value := range n.Pairs() {
		switch key.Value() {
		case "apiVersion":
			found[0], given[0] = value, true
		case "kind":
			found[1], given[1] = value, true
		}
	}
	values := [2]string{}
	for i, name := range []string{"apiVersion", "kind"} {
		if !given[i] {
			// Keys are case-sensitive: say which one was meant.
			for key := range n.Pairs() {
				if key.Kind() == scalarNode && strings.EqualFold(key.Value(), name) {
					return "", "", p.errorf(key, "%s: %s is required (found %q: keys are case-sensitive)", orDocument(where), name, key.Value())
				}
			}
			return "", "", p.errorf(n, "%s: %s is required", orDocument(where), name)
		}
		if values[i], err = p.scalar(found[i], name); err != nil {
			return "", "", err
		}
	}
	return values[0], values[1], nil
}

func orDocument(where string) string {
	if where == "" {
		return "document"
	}
	return where
}

// kubernetesList parses a `kind: List`: its items are documents of their own.
func (p *parser) kubernetesList(n node) ([]*policy.Policy, error) {
	fields, err := p.fields(n, "List", "apiVersion", "kind", "metadata", "items")
	if err != nil {
		return nil, err
	}
	itemsNode, ok := fields.get("items")
	if !ok {
		return nil, p.errorf(n, "List: items is required")
	}
	items, err := p.list(itemsNode, "items")
	if err != nil {
		return nil, err
	}
	var policies []*policy.Policy
	for i, item := range items {
		more, err := p.kubernetesDocument(item, fmt.Sprintf("items[%d]", i))
		if err != nil {
			return nil, err
		}
		policies = append(policies, more...)
	}
	return policies, nil
}

// networkPolicyNamePrefix starts the name of a NetworkPolicy's policy:
// networkpolicy/<namespace>/<name>, so that it never is a
// CiliumNetworkPolicy's (<namespace>/<name>, one '/'), which Kubernetes
// keeps as another object of the same namespace and name.
const networkPolicyNamePrefix = "networkpolicy/"

// metadata returns the policy's name: <namespace>/<name> when namespaced
// (namespace "default" when absent, as kubectl applies it in the default
// context), <name> otherwise, after prefix (networkPolicyNamePrefix or
// none); and the namespace. The name line is where the policy is.
func (p *parser) metadata(doc node, fields fieldSet, namespaced bool, prefix string) (name, namespace string, line int, err error) {
	metaNode, ok := fields.get("metadata")
	if !ok {
		return "", "", 0, p.errorf(doc, "metadata is required (with a name)")
	}
	allowed := append([]string{"name", "namespace"}, ignoredMetadata...)
	meta, err := p.fields(metaNode, "metadata", allowed...)
	if err != nil {
		return "", "", 0, err
	}
	nameNode, ok := meta.get("name")
	if !ok {
		return "", "", 0, p.errorf(metaNode, "metadata.name is required")
	}
	if name, err = p.scalar(nameNode, "metadata.name"); err != nil {
		return "", "", 0, err
	}
	if err := validateDNSName(name, maxNameLength, true); err != nil {
		return "", "", 0, p.errorf(nameNode, "metadata.name: %v", err)
	}
	namespace = "default"
	if nsNode, ok := meta.get("namespace"); ok {
		if !namespaced {
			return "", "", 0, p.errorf(nsNode, "metadata.namespace: a cluster-wide policy has no namespace")
		}
		if namespace, err = p.scalar(nsNode, "metadata.namespace"); err != nil {
			return "", "", 0, err
		}
		if err := validateDNSName(namespace, 63, false); err != nil {
			return "", "", 0, p.errorf(nsNode, "metadata.namespace: %v", err)
		}
	}
	if namespaced {
		name = prefix + namespace + "/" + name
	} else {
		name, namespace = prefix+name, ""
	}
	if line, dup := p.names[name]; dup {
		return "", "", 0, p.errorf(nameNode, "name %q is already used at line %d", name, line)
	}
	p.names[name] = nameNode.Line()
	p.nameColumns = append(p.nameColumns, nameNode.Column())
	p.current = name
	return name, namespace, nameNode.Line(), nil
}

// validateDNSName accepts a Kubernetes object name: a DNS subdomain
// (lower-case letters, digits, '-' and '.') or, for a namespace, a DNS
// label (no '.'), starting and ending with a letter or digit.
func validateDNSName(name string, maxLength int, dots bool) error {
	if name == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(name) > maxLength {
		return fmt.Errorf("%q is longer than %d characters", name, maxLength)
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	for i := range len(name) {
		if c := name[i]; !alnum(c) && c != '-' && (c != '.' || !dots) {
			want := "lower-case letters, digits, '-' or '.'"
			if !dots {
				want = "lower-case letters, digits or '-'"
			}
			return fmt.Errorf("%q: character %q not allowed, want %s", name, c, want)
		}
	}
	if !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return fmt.Errorf("%q must start and end with a letter or digit", name)
	}
	return nil
}

// boolean parses a YAML boolean; a quoted "true" is a string, which the
// API server rejects for a boolean field.
func (p *parser) boolean(n node, what string) (bool, error) {
	s, err := p.scalar(n, what)
	if err != nil {
		return false, err
	}
	if isBool(n) {
		switch s {
		case "true", "True", "TRUE":
			return true, nil
		case "false", "False", "FALSE":
			return false, nil
		}
	}
	return false, p.errorf(n, "%s: %q: want true or false, not quoted", what, s)
}

// number parses a decimal number in 0..max, written without sign or
// leading zeros (an octal or hexadecimal port is a mistake more often
// than a choice).
func number(n node, max uint64) (uint64, bool) {
	s := n.Value()
	if n.Kind() != scalarNode || isNull(n) || s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil && v <= max
}

// unsupportedField returns an error naming the first field of a mapping
// (in file order) that reasons has, with its reason: a field this agent
// knows but cannot enforce is rejected, never ignored.
func (p *parser) unsupportedField(n node, what string, reasons map[string]string) error {
	for key := range n.Pairs() {
		if reason, ok := reasons[key.Value()]; ok {
			return p.errorf(key, "%s.%s: %s", what, key.Value(), reason)
		}
	}
	return nil
}
