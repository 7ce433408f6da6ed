// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"fmt"
	"iter"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// networkPolicy parses a Kubernetes NetworkPolicy with Kubernetes'
// semantics: policyTypes defaults to Ingress, plus Egress when there are
// egress rules; a listed type without rules denies that direction; a rule
// without from (to) is every peer, one without ports every port; a port
// without protocol is TCP, one without a number every port.
func (p *parser) networkPolicy(n node) (*policy.Policy, error) {
	fields, err := p.fields(n, policy.KindNetworkPolicy, "apiVersion", "kind", "metadata", "spec", "status")
	if err != nil {
		return nil, err
	}
	name, namespace, line, err := p.metadata(n, fields, true, networkPolicyNamePrefix)
	if err != nil {
		return nil, err
	}
	pol := &policy.Policy{Name: name, File: p.file, Line: line, Kind: policy.KindNetworkPolicy}
	specNode, ok := fields.get("spec")
	if !ok {
		return nil, p.errorf(n, "%s: spec is required", policy.KindNetworkPolicy)
	}
	spec, err := p.fields(specNode, "spec", "podSelector", "policyTypes", "ingress", "egress")
	if err != nil {
		return nil, err
	}
	pol.Selector = policy.EndpointSelector{Namespace: namespace}
	if value, ok := spec.get("podSelector"); ok {
		if pol.Selector, err = p.endpointSelector(value, "spec.podSelector", namespace, false); err != nil {
			return nil, err
		}
	}
	// The rule list of each direction, and its length.
	var (
		ruleNodes [2]node
		counts    [2]int
	)
	for _, dir := range policy.Directions() {
		value, ok := spec.get(dir.String())
		if !ok {
			continue
		}
		// As in the native format: a key without value is what a file cut
		// mid-write looks like, and here it would deny the direction.
		if isNull(value) {
			return nil, p.errorf(value, "spec.%s: no rules (write `%s: []` for none)", dir, dir)
		}
		if _, err = p.list(value, "spec."+dir.String()); err != nil {
			return nil, err
		}
		ruleNodes[dir], counts[dir] = value, value.Len()
	}
	types, typesLine, err := p.policyTypes(spec, specNode, counts[policy.Egress] > 0)
	if err != nil {
		return nil, err
	}
	for _, dir := range policy.Directions() {
		if !types[dir] {
			if counts[dir] > 0 {
				return nil, p.errorf(ruleNodes[dir], "spec.%s: rules given but policyTypes does not list %s: Kubernetes would ignore them",
					dir, policyTypeName(dir))
			}
			continue
		}
		var out []policy.Rule
		if counts[dir] == 0 {
			// A listed type without rules isolates the direction: a rule
			// that selects nothing.
			out = append(out, policy.Rule{Name: dir.String(), Line: typesLine})
		} else {
			for i, item := range ruleNodes[dir].Items() {
				name := fmt.Sprintf("%s[%d]", dir, i)
				rule, err := p.networkPolicyRule(item, dir, "spec."+name, namespace)
				if err != nil {
					return nil, err
				}
				rule.Name, rule.Line, rule.Column = name, item.Line(), item.Column()
				out = append(out, rule)
			}
		}
		if dir == policy.Ingress {
			pol.Ingress = out
		} else {
			pol.Egress = out
		}
	}
	return pol, nil
}

func policyTypeName(dir policy.Direction) string {
	if dir == policy.Ingress {
		return "Ingress"
	}
	return "Egress"
}

// policyTypes returns the directions the policy applies to, and the line
// that says so (policyTypes, else the spec's).
func (p *parser) policyTypes(spec fieldSet, specNode node, egressRules bool) ([2]bool, int, error) {
	value, ok := spec.get("policyTypes")
	var items iter.Seq2[int, node]
	if ok {
		var err error
		if items, err = p.list(value, "spec.policyTypes"); err != nil {
			return [2]bool{}, 0, err
		}
	}
	if !ok || value.Len() == 0 {
		// Kubernetes' defaulting.
		return [2]bool{policy.Ingress: true, policy.Egress: egressRules}, specNode.Line(), nil
	}
	var types [2]bool
	for i, item := range items {
		what := fmt.Sprintf("spec.policyTypes[%d]", i)
		s, err := p.scalar(item, what)
		if err != nil {
			return [2]bool{}, 0, err
		}
		var dir policy.Direction
		switch s {
		case "Ingress":
			dir = policy.Ingress
		case "Egress":
			dir = policy.Egress
		default:
			return [2]bool{}, 0, p.errorf(item, "%s: %q: want Ingress or Egress", what, s)
		}
		if types[dir] {
			return [2]bool{}, 0, p.errorf(item, "%s: %s given twice", what, s)
		}
		types[dir] = true
	}
	return types, value.Line(), nil
}

// networkPolicyRule parses {from, ports} or {to, ports}; namespace is the
// policy's.
func (p *parser) networkPolicyRule(n node, dir policy.Direction, what, namespace string) (policy.Rule, error) {
	peerField := "to"
	if dir == policy.Ingress {
		peerField = "from"
	}
	fields, err := p.fields(n, what, peerField, "ports")
	if err != nil {
		return policy.Rule{}, err
	}
	var rule policy.Rule
	if value, ok := fields.get(peerField); ok {
		peers, err := p.list(value, what+"."+peerField)
		if err != nil {
			return policy.Rule{}, err
		}
		for i, peer := range peers {
			if err := p.networkPolicyPeer(peer, fmt.Sprintf("%s.%s[%d]", what, peerField, i), namespace, &rule); err != nil {
				return policy.Rule{}, err
			}
		}
	}
	// No peers: every peer (Kubernetes: "matches all sources").
	rule.AnyPeer = len(rule.Peers) == 0 && len(rule.Endpoints) == 0
	if value, ok := fields.get("ports"); ok {
		ports, err := p.list(value, what+".ports")
		if err != nil {
			return policy.Rule{}, err
		}
		for i, port := range ports {
			more, err := p.networkPolicyPort(port, fmt.Sprintf("%s.ports[%d]", what, i))
			if err != nil {
				return policy.Rule{}, err
			}
			rule.Ports = append(rule.Ports, more)
		}
		rule.Ports = sortPorts(rule.Ports)
	}
	return rule, nil
}

// networkPolicyPeer parses one peer into rule, with Kubernetes' semantics:
// an ipBlock; a podSelector alone, the endpoints of the policy's namespace
// (namespace) it matches; a namespaceSelector alone, every endpoint of the
// namespaces whose labels it matches (`{}`: of every namespace); both, the
// endpoints matching both. A null selector is as absent, as in the API.
func (p *parser) networkPolicyPeer(peer node, what, namespace string, rule *policy.Rule) error {
	fields, err := p.fields(peer, what, "ipBlock", "podSelector", "namespaceSelector")
	if err != nil {
		return err
	}
	podNode, hasPods := fields.get("podSelector")
	hasPods = hasPods && !isNull(podNode)
	nsNode, hasNamespaces := fields.get("namespaceSelector")
	hasNamespaces = hasNamespaces && !isNull(nsNode)
	if block, ok := fields.get("ipBlock"); ok {
		if hasPods || hasNamespaces {
			return p.errorf(peer, "%s: ipBlock with podSelector or namespaceSelector in one peer: Kubernetes rejects it, write two peers", what)
		}
		set, err := p.cidrSet(block, what+".ipBlock", "Kubernetes")
		if err != nil {
			return err
		}
		if err := p.strictExcept(block, set, what+".ipBlock.except"); err != nil {
			return err
		}
		rule.Peers = append(rule.Peers, set)
		return nil
	}
	if !hasPods && !hasNamespaces {
		return p.errorf(peer, "%s: a peer needs ipBlock, podSelector or namespaceSelector", what)
	}
	var sel policy.EndpointSelector
	if hasPods {
		if sel, err = p.endpointSelector(podNode, what+".podSelector", "", false); err != nil {
			return err
		}
	}
	if !hasNamespaces {
		sel.Namespace = namespace
		rule.Endpoints = append(rule.Endpoints, sel)
		return nil
	}
	namespaces, err := p.endpointSelector(nsNode, what+".namespaceSelector", "", false)
	if err != nil {
		return err
	}
	// An endpoint's identity carries its namespace's labels under a prefix
	// (docs/CONTRACT.md, "Endpoints").
	for key, value := range namespaces.MatchLabels {
		if sel.MatchLabels == nil {
			sel.MatchLabels = map[string]string{}
		}
		sel.MatchLabels[namespaceLabelsPrefix+key] = value
	}
	for _, r := range namespaces.MatchExpressions {
		r.Key = namespaceLabelsPrefix + r.Key
		sel.MatchExpressions = append(sel.MatchExpressions, r)
	}
	rule.Endpoints = append(rule.Endpoints, sel)
	return nil
}

// networkPolicyPort parses {port, endPort, protocol}: protocol TCP when
// absent, every port of it when port is absent.
func (p *parser) networkPolicyPort(n node, what string) (policy.PortRange, error) {
	fields, err := p.fields(n, what, "port", "endPort", "protocol")
	if err != nil {
		return policy.PortRange{}, err
	}
	protocol := policy.ProtocolTCP
	if value, ok := fields.get("protocol"); ok {
		s, err := p.scalar(value, what+".protocol")
		if err != nil {
			return policy.PortRange{}, err
		}
		switch s {
		case "TCP":
		case "UDP":
			protocol = policy.ProtocolUDP
		case "SCTP":
			protocol = policy.ProtocolSCTP
		default:
			return policy.PortRange{}, p.errorf(value, "%s.protocol: %q: want TCP, UDP or SCTP", what, s)
		}
	}
	portNode, ok := fields.get("port")
	if !ok {
		if end, ok := fields.get("endPort"); ok {
			return policy.PortRange{}, p.errorf(end, "%s.endPort: needs a port to start from", what)
		}
		return policy.PortRange{Protocol: protocol}, nil
	}
	endNode, hasEnd := fields.get("endPort")
	// Kubernetes' port is an IntOrString: quoted, it is a port name,
	// and a name needs a letter, so `"80"` is rejected, not port 80.
	if _, digits := number(portNode, maxPortNumber); digits && isString(portNode) {
		return policy.PortRange{}, p.errorf(portNode, "%s.port: %q is quoted, so Kubernetes reads it as a port name, which needs a letter: write the number without quotes", what, portNode.Value())
	}
	start, end, err := p.portRange(portNode, endNode, hasEnd, what)
	if err != nil {
		return policy.PortRange{}, err
	}
	if start == 0 {
		return policy.PortRange{}, p.errorf(portNode, "%s.port: 0 is not a port (omit port for every port)", what)
	}
	return policy.PortRange{Protocol: protocol, Port: start, EndPort: end}, nil
}

// strictExcept rejects an ipBlock except prefix as long as (so equal to)
// its cidr: Kubernetes' API server rejects it ("must be a strict subset
// of cidr"), and read as written it would make the peer select nothing.
// set is block as cidrSet read it, which checked the except prefixes'
// syntax and that each is inside the cidr.
func (p *parser) strictExcept(block node, set policy.CIDRSelector, what string) error {
	if len(set.Except) == 0 {
		return nil
	}
	for key, value := range block.Pairs() {
		if key.Value() != "except" {
			continue
		}
		for i, item := range value.Items() {
			except, err := p.cidr(item, what, i)
			if err != nil {
				return err
			}
			if except.Bits() <= set.CIDR.Bits() {
				return p.errorf(item, "%s[%d]: %s is not a strict subset of cidr %s (as Kubernetes requires): the peer would select nothing",
					what, i, except, set.CIDR)
			}
		}
	}
	return nil
}
