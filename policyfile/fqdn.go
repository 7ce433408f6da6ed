// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// l7Message is why L7 rules other than DNS rules are rejected: the
// message those rules always had, saying which rules are taken.
const l7Message = "L7 rules are not supported: this agent enforces L3 and L4 only (and DNS rules, rules.dns)"

// fqdnSelectors parses toFQDNs or a DNS rule's dns: a non-empty list of
// {matchName, matchPattern}, each one of them (fqdn.Selector.Validate),
// its error at the value that is wrong.
func (p *parser) fqdnSelectors(n node, what string) ([]fqdn.Selector, error) {
	items, err := p.nonEmptyList(n, what)
	if err != nil {
		return nil, err
	}
	selectors := make([]fqdn.Selector, 0, n.Len())
	for i, item := range items {
		itemWhat := fmt.Sprintf("%s[%d]", what, i)
		fields, err := p.fields(item, itemWhat, "matchName", "matchPattern")
		if err != nil {
			return nil, err
		}
		var sel fqdn.Selector
		at := item
		if value, ok := fields.get("matchName"); ok {
			s, err := p.scalar(value, itemWhat+".matchName")
			if err != nil {
				return nil, err
			}
			// The selector outlives the file's content.
			sel.MatchName, at = strings.Clone(s), value
		}
		if value, ok := fields.get("matchPattern"); ok {
			s, err := p.scalar(value, itemWhat+".matchPattern")
			if err != nil {
				return nil, err
			}
			sel.MatchPattern, at = strings.Clone(s), value
		}
		if err := sel.Validate(); err != nil {
			return nil, p.errorf(at, "%s: %v", itemWhat, err)
		}
		selectors = append(selectors, sel)
	}
	return selectors, nil
}

// l7Rules parses the rules of a toPorts entry (the mapping entry, its
// place what): only dns is taken, and only in an egress allow rule (as
// Cilium: DNS rules are not allowed on ingress, and deny rules have no
// L7 rules). Other L7 rules keep the rejection they always had, at the
// rules key. No rules: nil.
func (p *parser) l7Rules(entry node, what string, dir policy.Direction, deny bool) ([]fqdn.Selector, error) {
	for key, value := range entry.Pairs() {
		if key.Value() != "rules" {
			continue
		}
		what += ".rules"
		fields, err := p.fields(value, what, "dns", "http", "kafka", "l7proto", "l7")
		if err != nil {
			return nil, err
		}
		for name := range value.Pairs() {
			if name.Value() != "dns" {
				return nil, p.errorf(key, "%s: %s, not %s", what, l7Message, name.Value())
			}
		}
		dns, ok := fields.get("dns")
		switch {
		case !ok:
			return nil, p.errorf(value, "%s: empty: want dns, the only L7 rules this agent takes", what)
		case dir == policy.Ingress:
			return nil, p.errorf(dns, "%s.dns: DNS rules are not allowed on ingress (as Cilium): they select the DNS an endpoint sends", what)
		case deny:
			return nil, p.errorf(dns, "%s.dns: DNS rules are not allowed in deny rules (as Cilium: deny rules have no L7 rules)", what)
		}
		return p.fqdnSelectors(dns, what+".dns")
	}
	return nil, nil
}

// dnsPorts checks the port ranges of one port of a toPorts entry with
// DNS rules, as Cilium does: a single port, not 0, of TCP, UDP or ANY.
// It returns the TCP and UDP ones, where DNS is intercepted (ANY's SCTP
// stays an L4 port).
func (p *parser) dnsPorts(n node, what string, ranges []policy.PortRange) ([]policy.PortRange, error) {
	var out []policy.PortRange
	for _, r := range ranges {
		switch {
		case r.Port == 0:
			return nil, p.errorf(n, "%s: DNS rules need the DNS port: port 0 (every port) is not allowed with them (as Cilium)", what)
		case r.EndPort != 0:
			return nil, p.errorf(n, "%s: DNS rules do not support port ranges (as Cilium)", what)
		case r.Protocol == policy.ProtocolTCP || r.Protocol == policy.ProtocolUDP:
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, p.errorf(n, "%s: DNS rules apply to TCP, UDP or ANY, not %s", what, ranges[0].Protocol)
	}
	return out, nil
}

// fqdnWarnings warns at each rule with toFQDNs of a policy whose
// endpoints no policy of the file gives a DNS rule: no answer would be
// read, so the names would allow nothing (Cilium's most common
// mistake). A policy gives the endpoints of another a DNS rule when its
// selector selects all of them as far as the selectors show
// (coversSelector); a DNS rule in another file is not seen, so the
// warning says it may be there.
func (p *parser) fqdnWarnings(policies []*policy.Policy) {
	// Most files have no toFQDNs: they cost one pass over the rules.
	var named bool
	var withDNS []*policy.Policy
	for _, pol := range policies {
		dns := false
		for _, rule := range pol.Egress {
			if rule.FQDN != nil {
				named = named || len(rule.FQDN.Selectors) > 0
				dns = dns || len(rule.FQDN.DNS) > 0
			}
		}
		if dns {
			withDNS = append(withDNS, pol)
		}
	}
	if !named {
		return
	}
	for _, pol := range policies {
		if slices.ContainsFunc(withDNS, func(other *policy.Policy) bool { return coversSelector(&other.Selector, &pol.Selector) }) {
			continue
		}
		for _, rule := range pol.Egress {
			if rule.FQDN == nil || len(rule.FQDN.Selectors) == 0 {
				continue
			}
			p.warnings = append(p.warnings, Warning{File: p.file, Line: rule.Line, Column: rule.Column, Msg: fmt.Sprintf(
				"policy %q: %s.toFQDNs: no policy in this file gives its endpoints a DNS rule (toPorts: [{ports: [{port: \"53\", protocol: ANY}], rules: {dns: [...]}}]): "+
					"the agent learns names only from the DNS its rules intercept, so this rule allows nothing unless a policy of another file gives them one",
				pol.Name, rule.Name)})
		}
	}
	slices.SortStableFunc(p.warnings, func(a, b Warning) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
}

// addDNSRules adds DNS rules to a rule.
func addDNSRules(rule *policy.Rule, dns ...policy.DNSRule) {
	if len(dns) == 0 {
		return
	}
	if rule.FQDN == nil {
		rule.FQDN = &policy.FQDNRule{}
	}
	rule.FQDN.DNS = append(rule.FQDN.DNS, dns...)
}

// coversSelector reports whether the selector outer selects every
// endpoint inner selects, as far as their text shows: outer's namespace
// is none or inner's, and each of its labels and expressions is one of
// inner's.
func coversSelector(outer, inner *policy.EndpointSelector) bool {
	if outer.Namespace != "" && outer.Namespace != inner.Namespace {
		return false
	}
	for k, v := range outer.MatchLabels {
		if have, ok := inner.MatchLabels[k]; !ok || have != v {
			return false
		}
	}
	for _, r := range outer.MatchExpressions {
		if !slices.ContainsFunc(inner.MatchExpressions, func(o policy.Requirement) bool {
			return o.Key == r.Key && o.Operator == r.Operator && slices.Equal(o.Values, r.Values)
		}) {
			return false
		}
	}
	return true
}
