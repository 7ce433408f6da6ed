// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// maxNameLength bounds policy names, as Kubernetes bounds object names.
const maxNameLength = 253

// Parse parses a policy file (docs/CONTRACT.md, "Policy file formats"):
// one or more YAML documents, each a native policy, a CiliumNetworkPolicy,
// a CiliumClusterwideNetworkPolicy, a NetworkPolicy or a List of those
// (k8s.go, cnp.go, netpol.go); empty documents are skipped. file is the
// file's name, for the policies and for errors. The whole file is
// validated: the first error rejects it.
//
// Strict: unknown or repeated fields, YAML aliases, a missing, malformed or
// repeated policy name, an ingress or egress key without a value in a
// native policy or a NetworkPolicy (a file cut mid-write; `egress: []` is
// no rules; a Cilium spec reads it as Cilium does), a CIDR that does not parse
// (one with host bits set is read as its prefix, with a warning that
// ParseFile gives), an except prefix outside its CIDR, an empty CIDR or port list, a port
// outside 1..65535, an endPort below its port and a protocol other than
// TCP, UDP or SCTP are errors. A CIDR may be a bare address (a host
// prefix). A port without protocol stands for both TCP and UDP; ports or
// icmps without peers are for every peer (as Cilium's toPorts without
// peers). Peers by label are read into Rule.Endpoints and entities other
// than world and all into Rule.Entities (selector.go, cnp.go, netpol.go),
// toFQDNs and DNS rules into Rule.FQDN (fqdn.go).
//
// Memory is bounded by the content's size: a document with more YAML
// nodes than the content's size allows (one per 4 bytes, plus 4096) is an
// error, found as the document is read, so that a parse allocates at most
// about 10 times the content's size whatever the content (README).
//
// Possible errors: *FileError wrapping ErrInvalidPolicy.
func Parse(file string, content []byte) ([]*policy.Policy, error) {
	parsed, err := ParseFile(file, content)
	return parsed.Policies, err
}

// Parsed is a policy file as ParseFile reads it.
type Parsed struct {
	Policies []*policy.Policy
	// NameColumns are the columns of the policies' names, in the order
	// of Policies (Policy.Line is their line): where an error about a
	// name, such as another file's use of it, points.
	NameColumns []int
	// Warnings are what the file says that the agent reads otherwise
	// than written (a CIDR with host bits set, read as its prefix; a
	// toFQDNs rule whose endpoints no DNS rule of the file intercepts),
	// in file order: the file is valid, and its author should know.
	Warnings []Warning
}

// ParseFile is Parse, with the positions of the policies' names and the
// warnings.
//
// Possible errors: *FileError wrapping ErrInvalidPolicy; Parsed is empty
// then.
func ParseFile(file string, content []byte) (Parsed, error) {
	p := &parser{file: file, names: map[string]int{}, size: len(content)}
	docs := newDocumentReader(content, nodeBudget(len(content)))
	policies := []*policy.Policy{}
	for {
		root, err := docs.next()
		if errors.Is(err, io.EOF) {
			p.fqdnWarnings(policies)
			return Parsed{Policies: policies, NameColumns: p.nameColumns, Warnings: p.warnings}, nil
		}
		if err != nil {
			return Parsed{}, p.syntaxError(err)
		}
		if isNull(root) {
			continue
		}
		if isKubernetesDocument(root) {
			more, err := p.kubernetesDocument(root, "")
			if err != nil {
				return Parsed{}, err
			}
			policies = append(policies, more...)
			continue
		}
		pol, err := p.policy(root)
		if err != nil {
			return Parsed{}, err
		}
		pol.Kind = policy.KindNative
		policies = append(policies, pol)
	}
}

type parser struct {
	file string
	// current is the name of the policy being parsed, for errors.
	current string
	// names are the policies' names so far, with their lines, and
	// nameColumns their columns, in the order of the policies.
	names       map[string]int
	nameColumns []int
	// warnings are the file's so far.
	warnings []Warning
	// size is the file's, for the node budget's error.
	size int
}

// syntaxError turns the YAML reader's error into one with a position.
func (p *parser) syntaxError(err error) error {
	line, column, msg, tooManyNodes := syntaxPosition(err)
	if tooManyNodes {
		return &FileError{File: p.file, Line: line, Err: fmt.Errorf(
			"%w: more YAML values, lists and mappings in a document than a file of %d bytes may have (%d: one per %d bytes, plus %d)",
			ErrInvalidPolicy, p.size, nodeBudget(p.size), nodeBytes, nodeAllowance)}
	}
	return &FileError{File: p.file, Line: line, Column: column, Err: fmt.Errorf("%w: YAML: %s", ErrInvalidPolicy, msg)}
}

// warnf adds a warning at n, once per position (a value read twice
// warns once).
func (p *parser) warnf(n node, format string, args ...any) {
	line, column := n.Line(), n.Column()
	if slices.ContainsFunc(p.warnings, func(w Warning) bool { return w.Line == line && w.Column == column }) {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if p.current != "" {
		msg = fmt.Sprintf("policy %q: %s", p.current, msg)
	}
	p.warnings = append(p.warnings, Warning{File: p.file, Line: line, Column: column, Msg: msg})
}

func (p *parser) errorf(n node, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if p.current != "" {
		msg = fmt.Sprintf("policy %q: %s", p.current, msg)
	}
	return &FileError{File: p.file, Line: n.Line(), Column: n.Column(), Err: fmt.Errorf("%w: %s", ErrInvalidPolicy, msg)}
}

func kindName(n node) string {
	switch n.Kind() {
	case mappingNode:
		return "a mapping"
	case sequenceNode:
		return "a list"
	case scalarNode:
		if isNull(n) {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value())
	}
	return "a document"
}

// maxFields is the most fields a mapping of any format may allow: a
// Kubernetes object's metadata, with the fields it ignores, has the most.
const maxFields = 16

// fieldSet is the values of a mapping's fields, by the field's place in
// the allowed list (a value, not a map: a parse allocates per CIDR only
// what the policy keeps).
type fieldSet struct {
	allowed []string
	values  [maxFields]node
	// given has bit i set when the field allowed[i] is given.
	given uint32
}

// get returns the value of the field name, if given.
func (f *fieldSet) get(name string) (node, bool) {
	i := slices.Index(f.allowed, name)
	if i < 0 || f.given&(1<<i) == 0 {
		return node{}, false
	}
	return f.values[i], true
}

// fields returns the values of a mapping's keys. Keys must be among
// allowed (at most maxFields, or it panics: a parser's mistake, which
// every test of the parser finds) and given once (the reader rejects a
// key given twice).
func (p *parser) fields(n node, what string, allowed ...string) (fieldSet, error) {
	if len(allowed) > maxFields {
		panic(fmt.Sprintf("policyfile: %s: %d fields allowed, at most %d", what, len(allowed), maxFields))
	}
	if n.Kind() != mappingNode {
		return fieldSet{}, p.errorf(n, "%s: want a mapping, got %s", what, kindName(n))
	}
	values := fieldSet{allowed: allowed}
	for key, value := range n.Pairs() {
		if key.Kind() != scalarNode {
			return fieldSet{}, p.errorf(key, "%s: want a field name, got %s", what, kindName(key))
		}
		i := slices.Index(allowed, key.Value())
		if i < 0 {
			return fieldSet{}, p.errorf(key, "%s: unknown field %q, want one of %s", what, key.Value(), strings.Join(allowed, ", "))
		}
		if values.given&(1<<i) != 0 {
			return fieldSet{}, p.errorf(key, "%s: field %q given twice", what, key.Value())
		}
		values.values[i] = value
		values.given |= 1 << i
	}
	return values, nil
}

// list returns the items of a sequence; null is the empty list.
func (p *parser) list(n node, what string) (iter.Seq2[int, node], error) {
	if isNull(n) {
		return func(func(int, node) bool) {}, nil
	}
	if n.Kind() != sequenceNode {
		return nil, p.errorf(n, "%s: want a list, got %s", what, kindName(n))
	}
	return n.Items(), nil
}

func (p *parser) scalar(n node, what string) (string, error) {
	if n.Kind() != scalarNode || isNull(n) {
		return "", p.errorf(n, "%s: want a value, got %s", what, kindName(n))
	}
	return n.Value(), nil
}

func (p *parser) policy(n node) (*policy.Policy, error) {
	p.current = ""
	fields, err := p.fields(n, "policy", nativePolicyFields...)
	if err != nil {
		return nil, err
	}
	nameNode, ok := fields.get("name")
	if !ok {
		return nil, p.errorf(n, "policy: name is required")
	}
	name, err := p.scalar(nameNode, "name")
	if err != nil {
		return nil, err
	}
	if err := validateName(name); err != nil {
		return nil, p.errorf(nameNode, "name: %v", err)
	}
	if line, dup := p.names[name]; dup {
		return nil, p.errorf(nameNode, "name %q is already used at line %d", name, line)
	}
	// The name outlives the file's content, of which it is a part.
	name = strings.Clone(name)
	p.names[name] = nameNode.Line()
	p.nameColumns = append(p.nameColumns, nameNode.Column())
	p.current = name

	pol := &policy.Policy{Name: name, File: p.file, Line: nameNode.Line()}
	if value, ok := fields.get("endpointSelector"); ok {
		if pol.Selector, err = p.endpointSelector(value, "endpointSelector", "", true); err != nil {
			return nil, err
		}
	}
	var added [2]int
	for _, field := range []struct {
		name string
		dir  policy.Direction
		deny bool
	}{{"ingress", policy.Ingress, false}, {"ingressDeny", policy.Ingress, true}, {"egress", policy.Egress, false}, {"egressDeny", policy.Egress, true}} {
		rulesNode, ok := fields.get(field.name)
		if !ok {
			continue
		}
		// A rule list key with nothing after it is what a file cut at a
		// line boundary mid-write looks like: read as no rules, it would
		// drop the traffic the rest of the file allows.
		if isNull(rulesNode) {
			return nil, p.errorf(rulesNode, "%s: no rules (write `%s: []` for none)", field.name, field.name)
		}
		items, err := p.list(rulesNode, field.name)
		if err != nil {
			return nil, err
		}
		for i, item := range items {
			ruleName := fmt.Sprintf("%s[%d]", field.name, i)
			rule, err := p.rule(item, field.dir, field.deny, ruleName)
			if err != nil {
				return nil, err
			}
			rule.Deny, rule.Name, rule.Line, rule.Column = field.deny, ruleName, item.Line(), item.Column()
			if field.dir == policy.Ingress {
				pol.Ingress = append(pol.Ingress, rule)
			} else {
				pol.Egress = append(pol.Egress, rule)
			}
			added[field.dir]++
		}
	}
	if value, ok := fields.get("enableDefaultDeny"); ok {
		if err := p.enableDefaultDeny(value, "enableDefaultDeny", "", pol, added); err != nil {
			return nil, err
		}
	}
	return pol, nil
}

// validateName accepts names usable as (part of) a resource name and in
// tables: letters, digits, '-', '.', '_', starting and ending with a
// letter or digit.
func validateName(name string) error {
	if name == "" {
		return errors.New("must not be empty")
	}
	if len(name) > maxNameLength {
		return fmt.Errorf("%q is longer than %d characters", name, maxNameLength)
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := range len(name) {
		c := name[i]
		if !alnum(c) && c != '-' && c != '.' && c != '_' {
			return fmt.Errorf("%q: character %q not allowed, want letters, digits, '-', '.' or '_'", name, c)
		}
	}
	if !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return fmt.Errorf("%q must start and end with a letter or digit", name)
	}
	return nil
}

// The fields of a native policy and of its ingress and egress rules: one
// slice each, not a literal per call (a parse allocates per policy only
// what the policy keeps).
var (
	nativePolicyFields = []string{"name", "endpointSelector", "ingress", "ingressDeny", "egress", "egressDeny", "enableDefaultDeny"}
	nativeRuleFields   = [2][]string{
		policy.Ingress: {"fromCIDR", "fromCIDRSet", "toPorts", "icmps", "fromEndpoints", "fromEntities"},
		policy.Egress:  {"toCIDR", "toCIDRSet", "toPorts", "icmps", "toEndpoints", "toEntities", "toFQDNs"},
	}
)

// rule parses one ingress or ingressDeny (fromCIDR, fromCIDRSet,
// fromEndpoints, fromEntities, toPorts, icmps) or egress or egressDeny
// (toCIDR, toCIDRSet, toEndpoints, toEntities, toFQDNs, toPorts, icmps)
// rule (deny: ingressDeny or egressDeny). Ports or ICMP types without
// peers are for every peer (AnyPeer), as in Cilium; a rule with neither
// only makes its direction enforced. As in Cilium, label peers, entities
// and toFQDNs are each a rule's only kind of peer (CIDRs and CIDR sets
// may share one, as this format always allowed), toFQDNs and DNS rules
// (a port's rules.dns) are for egress allow rules only.
func (p *parser) rule(n node, dir policy.Direction, deny bool, what string) (policy.Rule, error) {
	peer := "to"
	if dir == policy.Ingress {
		peer = "from"
	}
	cidrField, setField, endpointsField, entityField := peer+"CIDR", peer+"CIDRSet", peer+"Endpoints", peer+"Entities"
	fields, err := p.fields(n, what, nativeRuleFields[dir]...)
	if err != nil {
		return policy.Rule{}, err
	}
	// The first peer field, and whether it may share the rule (CIDRs).
	peerField, sharing := "", false
	for key := range n.Pairs() {
		switch name := key.Value(); name {
		case "toFQDNs":
			if deny {
				return policy.Rule{}, p.errorf(key, "%s.toFQDNs: not allowed in egressDeny (as Cilium: deny rules have no toFQDNs): deny the CIDRs", what)
			}
			fallthrough
		case cidrField, setField, endpointsField, entityField:
			cidrs := name == cidrField || name == setField
			if peerField != "" && !(cidrs && sharing) {
				return policy.Rule{}, p.errorf(key, "%s: %s and %s in one rule: as in Cilium, write two rules", what, peerField, name)
			}
			if peerField == "" {
				peerField, sharing = name, cidrs
			}
		}
	}
	var rule policy.Rule
	if value, ok := fields.get(endpointsField); ok {
		if err := p.endpointPeers(value, what+"."+endpointsField, "", &rule); err != nil {
			return policy.Rule{}, err
		}
	}
	if value, ok := fields.get(entityField); ok {
		if err := p.entities(value, what+"."+entityField, &rule); err != nil {
			return policy.Rule{}, err
		}
	}
	if value, ok := fields.get(cidrField); ok {
		if rule.Peers, err = p.cidrPeers(value, what+"."+cidrField); err != nil {
			return policy.Rule{}, err
		}
	}
	if value, ok := fields.get(setField); ok {
		items, err := p.nonEmptyList(value, what+"."+setField)
		if err != nil {
			return policy.Rule{}, err
		}
		for i, item := range items {
			set, err := p.cidrSet(item, fmt.Sprintf("%s.%s[%d]", what, setField, i), "")
			if err != nil {
				return policy.Rule{}, err
			}
			rule.Peers = append(rule.Peers, set)
		}
	}
	if value, ok := fields.get("toFQDNs"); ok {
		selectors, err := p.fqdnSelectors(value, what+".toFQDNs")
		if err != nil {
			return policy.Rule{}, err
		}
		rule.FQDN = &policy.FQDNRule{Selectors: selectors}
	}
	portsNode, hasPorts := fields.get("toPorts")
	icmpsNode, hasICMPs := fields.get("icmps")
	if hasPorts && hasICMPs {
		return policy.Rule{}, p.errorf(icmpsNode, "%s.icmps: icmps and toPorts in one rule: as in Cilium, write two rules", what)
	}
	if hasPorts {
		items, err := p.nonEmptyList(portsNode, what+".toPorts")
		if err != nil {
			return policy.Rule{}, err
		}
		for i, item := range items {
			itemWhat := fmt.Sprintf("%s.toPorts[%d]", what, i)
			ports, err := p.port(item, itemWhat)
			if err != nil {
				return policy.Rule{}, err
			}
			rule.Ports = append(rule.Ports, ports...)
			// A native port is Cilium's toPorts entry of one port: its
			// rules are that port's.
			names, err := p.l7Rules(item, itemWhat, dir, deny)
			if err != nil {
				return policy.Rule{}, err
			}
			if names != nil {
				dnsPorts, err := p.dnsPorts(item, itemWhat, ports)
				if err != nil {
					return policy.Rule{}, err
				}
				addDNSRules(&rule, policy.DNSRule{Ports: dnsPorts, Names: names})
			}
		}
		rule.Ports = sortPorts(rule.Ports)
	}
	if hasICMPs {
		if rule.Ports, err = p.icmpRules(icmpsNode, what+".icmps"); err != nil {
			return policy.Rule{}, err
		}
	}
	if peerField == "" && (hasPorts || hasICMPs) {
		rule.AnyPeer = true
	}
	return rule, nil
}

func (p *parser) nonEmptyList(n node, what string) (iter.Seq2[int, node], error) {
	items, err := p.list(n, what)
	if err == nil && n.Len() == 0 {
		err = p.errorf(n, "%s: empty list, omit the field instead", what)
	}
	return items, err
}

// cidrPeers reads a non-empty list of CIDRs (toCIDR, fromCIDR), each a
// peer without except.
func (p *parser) cidrPeers(n node, what string) ([]policy.CIDRSelector, error) {
	items, err := p.nonEmptyList(n, what)
	if err != nil {
		return nil, err
	}
	peers := make([]policy.CIDRSelector, 0, n.Len())
	for i, item := range items {
		cidr, err := p.cidr(item, what, i)
		if err != nil {
			return nil, err
		}
		peers = append(peers, policy.CIDRSelector{CIDR: cidr})
	}
	return peers, nil
}

// cidrSet parses {cidr, except}. prefixesOnly names the API (Cilium,
// Kubernetes) whose CIDR sets take no bare address, cidr or except, as a
// CIDR list does; empty (the native format), they take them.
func (p *parser) cidrSet(n node, what, prefixesOnly string) (policy.CIDRSelector, error) {
	fields, err := p.fields(n, what, "cidr", "except")
	if err != nil {
		return policy.CIDRSelector{}, err
	}
	cidrNode, ok := fields.get("cidr")
	if !ok {
		return policy.CIDRSelector{}, p.errorf(n, "%s: cidr is required", what)
	}
	if err := p.prefixLength(cidrNode, what+".cidr", prefixesOnly); err != nil {
		return policy.CIDRSelector{}, err
	}
	cidr, err := p.cidr(cidrNode, what+".cidr", -1)
	if err != nil {
		return policy.CIDRSelector{}, err
	}
	set := policy.CIDRSelector{CIDR: cidr}
	if value, ok := fields.get("except"); ok {
		items, err := p.nonEmptyList(value, what+".except")
		if err != nil {
			return policy.CIDRSelector{}, err
		}
		field := what + ".except"
		for i, item := range items {
			if err := p.prefixLength(item, fmt.Sprintf("%s[%d]", field, i), prefixesOnly); err != nil {
				return policy.CIDRSelector{}, err
			}
			except, err := p.cidr(item, field, i)
			if err != nil {
				return policy.CIDRSelector{}, err
			}
			if !prefixkey.Inside(cidr, except) {
				return policy.CIDRSelector{}, p.errorf(item, "%s[%d]: %s is not inside %s", field, i, except, cidr)
			}
			set.Except = append(set.Except, except)
		}
		slices.SortFunc(set.Except, prefixkey.Compare)
		set.Except = slices.Compact(set.Except)
	}
	return set, nil
}

// prefixLength rejects a bare address where api (not empty) requires a
// prefix length.
func (p *parser) prefixLength(n node, what, api string) error {
	if api == "" || n.Kind() != scalarNode || isNull(n) || strings.Contains(n.Value(), "/") {
		return nil
	}
	addr, err := netip.ParseAddr(n.Value())
	if err != nil {
		return nil // cidr says what is wrong
	}
	return p.errorf(n, "%s: %q has no prefix length, which %s requires in a CIDR set: write %s",
		what, n.Value(), api, netip.PrefixFrom(addr.WithZone(""), addr.BitLen()))
}

// cidr parses a CIDR or a bare address (a host prefix). A CIDR with host
// bits set is read as its prefix, with a warning; zones and IPv4-mapped
// IPv6 addresses are rejected (the ipcache
// keys IPv4 prefixes as IPv4). what[index] names it in errors (what
// alone for a negative index), formatted only for one.
func (p *parser) cidr(n node, what string, index int) (netip.Prefix, error) {
	name := func() string {
		if index < 0 {
			return what
		}
		return fmt.Sprintf("%s[%d]", what, index)
	}
	if n.Kind() != scalarNode || isNull(n) {
		return netip.Prefix{}, p.errorf(n, "%s: want a value, got %s", name(), kindName(n))
	}
	s := n.Value()
	var (
		prefix netip.Prefix
		err    error
	)
	if strings.Contains(s, "/") {
		prefix, err = netip.ParsePrefix(s)
	} else {
		var addr netip.Addr
		if addr, err = netip.ParseAddr(s); err == nil {
			if addr.Zone() != "" {
				return netip.Prefix{}, p.errorf(n, "%s: %q: zones are not allowed", name(), s)
			}
			prefix = netip.PrefixFrom(addr, addr.BitLen())
		}
	}
	switch {
	case err != nil:
		return netip.Prefix{}, p.errorf(n, "%s: %q is not a CIDR", name(), s)
	case prefix.Addr().Is4In6():
		return netip.Prefix{}, p.errorf(n, "%s: %q is an IPv4-mapped IPv6 prefix, write it as IPv4", name(), s)
	case prefix != prefix.Masked():
		// Cilium and Kubernetes read such a CIDR as its prefix: so does
		// this agent, but says so.
		p.warnf(n, "%s: %q: host bits set, read as %s", name(), s, prefix.Masked())
		prefix = prefix.Masked()
	}
	return prefix, nil
}

// port parses {port, endPort, protocol, rules}; without a protocol it is
// both TCP and UDP (not SCTP: this format predates SCTP ports and keeps
// its meaning). endPort, as in Cilium, makes the range port..endPort.
// rules is the caller's (l7Rules).
func (p *parser) port(n node, what string) ([]policy.PortRange, error) {
	fields, err := p.fields(n, what, "port", "endPort", "protocol", "rules")
	if err != nil {
		return nil, err
	}
	portNode, ok := fields.get("port")
	if !ok {
		return nil, p.errorf(n, "%s: port is required", what)
	}
	s, err := p.scalar(portNode, what+".port")
	if err != nil {
		return nil, err
	}
	if port, err := strconv.ParseUint(s, 10, 16); err != nil || port == 0 {
		return nil, p.errorf(portNode, "%s.port: %q is not a port number (1..65535)", what, s)
	}
	endNode, hasEnd := fields.get("endPort")
	start, end, err := p.portRange(portNode, endNode, hasEnd, what)
	if err != nil {
		return nil, err
	}
	protocols, err := p.portProtocols(&fields, what, []policy.Protocol{policy.ProtocolTCP, policy.ProtocolUDP}, false,
		"want TCP, UDP or SCTP (omit it for TCP and UDP)")
	if err != nil {
		return nil, err
	}
	return portRanges(protocols, start, end), nil
}

// portProtocols reads a port's protocol field: TCP, UDP or SCTP; absent
// (and, with anyAllowed, Cilium's ANY) is the given protocols. want ends
// the error for another value.
func (p *parser) portProtocols(fields *fieldSet, what string, absent []policy.Protocol, anyAllowed bool, want string) ([]policy.Protocol, error) {
	protocolNode, ok := fields.get("protocol")
	if !ok {
		return absent, nil
	}
	s, err := p.scalar(protocolNode, what+".protocol")
	if err != nil {
		return nil, err
	}
	switch {
	case s == "TCP":
		return []policy.Protocol{policy.ProtocolTCP}, nil
	case s == "UDP":
		return []policy.Protocol{policy.ProtocolUDP}, nil
	case s == "SCTP":
		return []policy.Protocol{policy.ProtocolSCTP}, nil
	case s == "ANY" && anyAllowed:
		return absent, nil
	}
	return nil, p.errorf(protocolNode, "%s.protocol: %q: %s", what, s, want)
}
