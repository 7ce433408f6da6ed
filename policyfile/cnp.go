// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Cilium's own bounds on a port rule (pkg/policy/api).
const (
	maxPortsPerRule  = 40
	maxICMPPerRule   = 40
	maxPortNumber    = 65535
	maxICMPType      = 255
	cidrGroupMessage = "CIDR groups are not supported: write the CIDRs"
)

// The fields of Cilium's rules that select or match what this agent has
// no means to know (services, nodes, L7 but DNS rules: l7Rules),
// with why they are rejected.
var (
	ciliumSpecUnsupported = map[string]string{
		"nodeSelector": "host policies are not supported: the policies apply to the endpoints behind --devices",
		"log":          "policy logging is not supported",
	}
	ciliumIngressUnsupported = map[string]string{
		"fromRequires":   "not supported: write the labels into each fromEndpoints selector",
		"fromGroups":     "cloud provider groups are not supported: write the CIDRs",
		"fromNodes":      "selecting nodes is not supported: write their CIDRs",
		"authentication": "mutual authentication is not supported",
	}
	ciliumEgressUnsupported = map[string]string{
		"toRequires":     "not supported: write the labels into each toEndpoints selector",
		"toServices":     "selecting services is not supported: write their CIDRs",
		"toGroups":       "cloud provider groups are not supported: write the CIDRs",
		"toNodes":        "selecting nodes is not supported: write their CIDRs",
		"authentication": "mutual authentication is not supported",
	}
	ciliumPortRuleUnsupported = map[string]string{
		"serverNames":    "TLS server names are not supported: this agent enforces L3 and L4 only",
		"listener":       "L7 listeners are not supported: this agent enforces L3 and L4 only",
		"terminatingTLS": "TLS termination is not supported: this agent enforces L3 and L4 only",
		"originatingTLS": "TLS origination is not supported: this agent enforces L3 and L4 only",
	}
)

// ciliumRuleFields are the fields of an ingress and of an egress rule
// (allow or deny), supported or not.
var ciliumRuleFields = [2][]string{
	policy.Ingress: {"fromCIDR", "fromCIDRSet", "fromEntities", "fromEndpoints", "toPorts", "icmps",
		"authentication", "fromGroups", "fromNodes", "fromRequires"},
	policy.Egress: {"toCIDR", "toCIDRSet", "toEntities", "toEndpoints", "toPorts", "icmps",
		"authentication", "toFQDNs", "toGroups", "toNodes", "toRequires", "toServices"},
}

// The ICMP and ICMPv6 type names Cilium accepts for `type` (the IANA
// names in CamelCase).
var (
	icmpTypes = map[string]uint16{
		"EchoReply": 0, "DestinationUnreachable": 3, "Redirect": 5, "Echo": 8, "EchoRequest": 8,
		"RouterAdvertisement": 9, "RouterSelection": 10, "TimeExceeded": 11, "ParameterProblem": 12,
		"Timestamp": 13, "TimestampReply": 14, "Photuris": 40, "ExtendedEchoRequest": 42, "ExtendedEchoReply": 43,
	}
	icmpv6Types = map[string]uint16{
		"DestinationUnreachable": 1, "PacketTooBig": 2, "TimeExceeded": 3, "ParameterProblem": 4,
		"EchoRequest": 128, "EchoReply": 129, "MulticastListenerQuery": 130, "MulticastListenerReport": 131,
		"MulticastListenerDone": 132, "RouterSolicitation": 133, "RouterAdvertisement": 134,
		"NeighborSolicitation": 135, "NeighborAdvertisement": 136, "RedirectMessage": 137,
		"RouterRenumbering": 138, "ICMPNodeInformationQuery": 139, "ICMPNodeInformationResponse": 140,
		"InverseNeighborDiscoverySolicitation": 141, "InverseNeighborDiscoveryAdvertisement": 142,
		"HomeAgentAddressDiscoveryRequest": 144, "HomeAgentAddressDiscoveryReply": 145,
		"MobilePrefixSolicitation": 146, "MobilePrefixAdvertisement": 147,
		"DuplicateAddressRequestCodeSuffix": 157, "DuplicateAddressConfirmationCodeSuffix": 158,
		"ExtendedEchoRequest": 160, "ExtendedEchoReply": 161,
	}
)

// ciliumPolicy parses a CiliumNetworkPolicy or CiliumClusterwideNetworkPolicy
// into one policy holding the rules of its spec and specs.
func (p *parser) ciliumPolicy(n node, kind string) (*policy.Policy, error) {
	// A description beside spec is not in Cilium's schema: the API server
	// prunes it (with a warning) and keeps the policy, and so does this
	// parser, whatever its value.
	fields, err := p.fields(n, kind, "apiVersion", "kind", "metadata", "spec", "specs", "status", "description")
	if err != nil {
		return nil, err
	}
	name, namespace, line, err := p.metadata(n, fields, kind == policy.KindCNP, "")
	if err != nil {
		return nil, err
	}
	pol := &policy.Policy{Name: name, File: p.file, Line: line, Kind: kind}
	specs, places := []node{}, []string{}
	if spec, ok := fields.get("spec"); ok {
		specs, places = append(specs, spec), append(places, "")
	}
	if value, ok := fields.get("specs"); ok {
		items, err := p.nonEmptyList(value, "specs")
		if err != nil {
			return nil, err
		}
		for i, item := range items {
			specs, places = append(specs, item), append(places, fmt.Sprintf("specs[%d].", i))
		}
	}
	if len(specs) == 0 {
		return nil, p.errorf(n, "%s: spec or specs is required", kind)
	}
	// A CNP selects in its own namespace whatever its selector says of the
	// namespace label, as Cilium does; a CCNP's (namespace "") may name one.
	for i, spec := range specs {
		what := strings.TrimSuffix(places[i], ".")
		if what == "" {
			what = "spec"
		}
		sel, selNode, err := p.ciliumSelector(spec, what, namespace)
		if err != nil {
			return nil, err
		}
		if err := p.ciliumSpec(spec, places[i], namespace, pol); err != nil {
			return nil, err
		}
		// The rules of one policy share its selector: specs that select
		// different endpoints are different policies.
		if i == 0 {
			pol.Selector = sel
		} else if !sel.Equal(&pol.Selector) {
			return nil, p.errorf(selNode, "%sendpointSelector: %s differs from the first spec's %s: specs of one policy with different endpoint selectors are not supported (write one policy per selector)",
				places[i], sel.String(), pol.Selector.String())
		}
	}
	return pol, nil
}

// ciliumSelector returns a spec's endpoint selector, restricted to
// namespace if not empty (a CNP's), and the node it is at.
func (p *parser) ciliumSelector(n node, what, namespace string) (policy.EndpointSelector, node, error) {
	fields, err := p.fields(n, what, ciliumSpecFields...)
	if err != nil {
		return policy.EndpointSelector{}, n, err
	}
	value, ok := fields.get("endpointSelector")
	if !ok {
		return policy.EndpointSelector{Namespace: namespace}, n, nil
	}
	sel, err := p.endpointSelector(value, what+".endpointSelector", namespace, true)
	if err != nil {
		return sel, value, err
	}
	if namespace != "" {
		// Cilium replaces a namespace that a CNP's selector names by the
		// policy's own.
		delete(sel.MatchLabels, policy.NamespaceLabel)
	}
	return sel, value, nil
}

// ciliumSpecFields are the fields of a Cilium rule (a spec), supported or
// not.
var ciliumSpecFields = []string{"endpointSelector", "nodeSelector", "ingress", "ingressDeny", "egress",
	"egressDeny", "enableDefaultDeny", "description", "labels", "log"}

// ciliumSpec appends the rules of one spec (a Cilium rule) to policy.
// place prefixes the rules' names ("specs[1]."); namespace is a CNP's
// (empty for a CCNP), where its label peers select.
func (p *parser) ciliumSpec(n node, place, namespace string, pol *policy.Policy) error {
	what := strings.TrimSuffix(place, ".")
	if what == "" {
		what = "spec"
	}
	fields, err := p.fields(n, what, ciliumSpecFields...)
	if err != nil {
		return err
	}
	if err := p.unsupportedField(n, what, ciliumSpecUnsupported); err != nil {
		return err
	}
	if value, ok := fields.get("description"); ok && !isNull(value) {
		if _, err := p.scalar(value, what+".description"); err != nil {
			return err
		}
	}
	if value, ok := fields.get("labels"); ok {
		if err := p.ruleLabels(value, what+".labels"); err != nil {
			return err
		}
	}
	// The rules of this spec in each direction, to apply its
	// enableDefaultDeny to.
	var added [2]int
	for _, field := range []struct {
		name string
		dir  policy.Direction
		deny bool
	}{{"ingress", policy.Ingress, false}, {"ingressDeny", policy.Ingress, true}, {"egress", policy.Egress, false}, {"egressDeny", policy.Egress, true}} {
		value, ok := fields.get(field.name)
		if !ok {
			continue
		}
		// As Cilium's decoder reads it: null is no list, as absent (a spec
		// with no rules at all is still an error, below).
		items, err := p.list(value, what+"."+field.name)
		if err != nil {
			return err
		}
		for i, item := range items {
			name := fmt.Sprintf("%s%s[%d]", place, field.name, i)
			// Errors give the rule's path from the document ("spec.egress[0]");
			// the rule's name, for explain, stays as short as "egress[0]".
			path := name
			if place == "" {
				path = "spec." + name
			}
			rule, err := p.ciliumRule(item, field.dir, field.deny, path, namespace)
			if err != nil {
				return err
			}
			rule.Name, rule.Line, rule.Column = name, item.Line(), item.Column()
			if field.dir == policy.Ingress {
				pol.Ingress = append(pol.Ingress, rule)
			} else {
				pol.Egress = append(pol.Egress, rule)
			}
			added[field.dir]++
		}
	}
	if added[policy.Ingress]+added[policy.Egress] == 0 {
		// Cilium rejects such a rule too.
		return p.errorf(n, "%s: no rules: at least one of ingress, ingressDeny, egress and egressDeny needs a rule", what)
	}
	value, ok := fields.get("enableDefaultDeny")
	if !ok {
		return nil
	}
	return p.enableDefaultDeny(value, what+".enableDefaultDeny", place, pol, added)
}

// enableDefaultDeny applies {ingress, egress: bool} to the rules the
// spec (or native policy) just added to policy (added: how many in each
// direction): false marks them NoDefaultDeny; true without rules in the
// direction adds an enforce-only rule (Cilium enforces the direction).
// what is the field's name in errors.
func (p *parser) enableDefaultDeny(value node, what, place string, pol *policy.Policy, added [2]int) error {
	defaultDeny, err := p.fields(value, what, "ingress", "egress")
	if err != nil {
		return err
	}
	for _, dir := range policy.Directions() {
		value, ok := defaultDeny.get(dir.String())
		if !ok {
			continue
		}
		enabled, err := p.boolean(value, what+"."+dir.String())
		if err != nil {
			return err
		}
		rules := &pol.Ingress
		if dir == policy.Egress {
			rules = &pol.Egress
		}
		switch {
		case !enabled:
			for i := len(*rules) - added[dir]; i < len(*rules); i++ {
				(*rules)[i].NoDefaultDeny = true
			}
		case added[dir] == 0:
			// Asked for explicitly, default deny applies without rules
			// in the direction: an enforce-only rule, as `egress: [{}]`.
			*rules = append(*rules, policy.Rule{Name: place + "enableDefaultDeny." + dir.String(), Line: value.Line()})
		}
	}
	return nil
}

// ruleLabels checks a Cilium rule's labels (a list of {key, value,
// source}); they name the rule and select nothing, so they are ignored.
func (p *parser) ruleLabels(n node, what string) error {
	items, err := p.list(n, what)
	if err != nil {
		return err
	}
	for i, item := range items {
		itemWhat := fmt.Sprintf("%s[%d]", what, i)
		if _, err := p.fields(item, itemWhat, "key", "value", "source"); err != nil {
			return err
		}
		for key, value := range item.Pairs() {
			if !isNull(value) {
				if _, err := p.scalar(value, itemWhat+"."+key.Value()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// ciliumRule parses one rule of ingress, ingressDeny, egress or egressDeny.
// namespace is a CNP's, where its label peers select (empty for a CCNP).
func (p *parser) ciliumRule(n node, dir policy.Direction, deny bool, what, namespace string) (policy.Rule, error) {
	peer, unsupported := "to", ciliumEgressUnsupported
	if dir == policy.Ingress {
		peer, unsupported = "from", ciliumIngressUnsupported
	}
	cidrField, setField, entityField, endpointsField := peer+"CIDR", peer+"CIDRSet", peer+"Entities", peer+"Endpoints"
	fields, err := p.fields(n, what, ciliumRuleFields[dir]...)
	if err != nil {
		return policy.Rule{}, err
	}
	if err := p.unsupportedField(n, what, unsupported); err != nil {
		return policy.Rule{}, err
	}
	// Cilium takes one kind of peer per rule; toFQDNs is one, of egress
	// allow rules only (Cilium's deny rules have no toFQDNs).
	peerField := ""
	for key := range n.Pairs() {
		name := key.Value()
		if name == "toFQDNs" && deny {
			return policy.Rule{}, p.errorf(key, "%s.toFQDNs: not allowed in egressDeny (as Cilium: deny rules have no toFQDNs): deny the CIDRs", what)
		}
		if name == cidrField || name == setField || name == entityField || name == endpointsField || name == "toFQDNs" {
			if peerField != "" {
				return policy.Rule{}, p.errorf(key, "%s: %s and %s in one rule: Cilium does not support combining them, write two rules",
					what, peerField, name)
			}
			peerField = name
		}
	}
	rule := policy.Rule{Deny: deny}
	if value, ok := fields.get(cidrField); ok {
		peers, err := p.cidrPeers(value, what+"."+cidrField)
		if err != nil {
			return policy.Rule{}, err
		}
		rule.Peers = append(rule.Peers, peers...)
	}
	if value, ok := fields.get(setField); ok {
		items, err := p.nonEmptyList(value, what+"."+setField)
		if err != nil {
			return policy.Rule{}, err
		}
		for i, item := range items {
			itemWhat := fmt.Sprintf("%s.%s[%d]", what, setField, i)
			if err := p.unsupportedField(item, itemWhat, map[string]string{
				"cidrGroupRef": cidrGroupMessage, "cidrGroupSelector": cidrGroupMessage}); err != nil {
				return policy.Rule{}, err
			}
			set, err := p.cidrSet(item, itemWhat, "Cilium")
			if err != nil {
				return policy.Rule{}, err
			}
			rule.Peers = append(rule.Peers, set)
		}
	}
	if value, ok := fields.get(entityField); ok {
		if err := p.entities(value, what+"."+entityField, &rule); err != nil {
			return policy.Rule{}, err
		}
	}
	if value, ok := fields.get(endpointsField); ok {
		if err := p.endpointPeers(value, what+"."+endpointsField, namespace, &rule); err != nil {
			return policy.Rule{}, err
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
		return policy.Rule{}, p.errorf(icmpsNode, "%s.icmps: icmps and toPorts in one rule: Cilium does not support combining them, write two rules", what)
	}
	if hasPorts {
		var dns []policy.DNSRule
		if rule.Ports, dns, err = p.ciliumPortRules(portsNode, what+".toPorts", dir, deny); err != nil {
			return policy.Rule{}, err
		}
		addDNSRules(&rule, dns...)
	}
	if hasICMPs {
		if rule.Ports, err = p.icmpRules(icmpsNode, what+".icmps"); err != nil {
			return policy.Rule{}, err
		}
	}
	// Ports without peers are ports to and from anywhere (Cilium's L3
	// wildcard); a rule with neither only makes its direction enforced.
	if peerField == "" && (hasPorts || hasICMPs) {
		rule.AnyPeer = true
	}
	return rule, nil
}

// entities parses toEntities or fromEntities: world is every address
// outside the ipcache's other identities, as the all-addresses CIDRs
// select it; all is every peer; none selects nothing; the others are
// Rule.Entities, each once, in the order written.
func (p *parser) entities(n node, what string, rule *policy.Rule) error {
	items, err := p.nonEmptyList(n, what)
	if err != nil {
		return err
	}
	for i, item := range items {
		itemWhat := fmt.Sprintf("%s[%d]", what, i)
		entity, err := p.scalar(item, itemWhat)
		if err != nil {
			return err
		}
		switch entity {
		case "all":
			rule.AnyPeer = true
		case "none":
		case "world-ipv4", "world-ipv6":
			return p.errorf(item, "%s: entity %q is not supported: this agent has one world identity (2) for both IP families, "+
				"so no rule selects the world of one family alone (toCIDR 0.0.0.0/0 or ::/0 selects that family's prefixes "+
				"and the world of both families); write world for both", itemWhat, entity)
		default:
			if !addEntity(rule, identity.Entity(entity)) {
				return p.errorf(item, "%s: unknown entity %q: want %s", itemWhat, entity, strings.Join(entityNames, ", "))
			}
		}
	}
	return nil
}

// entityNames are the entities a rule may name, for errors.
var entityNames = []string{"all", "world", "cluster", "host", "remote-node", "kube-apiserver", "health", "init",
	"ingress", "unmanaged", "none"}

// addEntity adds an entity to the rule's peers: world as the
// all-addresses CIDRs, cluster and the reserved entities to Entities
// (once each). It reports false for an entity that is neither.
func addEntity(rule *policy.Rule, entity identity.Entity) bool {
	if entity == identity.EntityWorld {
		for _, all := range policy.WorldPrefixes() {
			if !slices.ContainsFunc(rule.Peers, func(s policy.CIDRSelector) bool { return s.CIDR == all && len(s.Except) == 0 }) {
				rule.Peers = append(rule.Peers, policy.CIDRSelector{CIDR: all})
			}
		}
		return true
	}
	if _, reserved := entity.Reserved(); !reserved && entity != identity.EntityCluster {
		return false
	}
	if !slices.Contains(rule.Entities, entity) {
		rule.Entities = append(rule.Entities, entity)
	}
	return true
}

// ciliumPortRules parses toPorts: a list of {ports, rules}, rules only
// DNS rules (l7Rules), in a rule of the direction dir (deny: a deny
// rule).
func (p *parser) ciliumPortRules(n node, what string, dir policy.Direction, deny bool) ([]policy.PortRange, []policy.DNSRule, error) {
	items, err := p.nonEmptyList(n, what)
	if err != nil {
		return nil, nil, err
	}
	var (
		ports []policy.PortRange
		dns   []policy.DNSRule
	)
	for i, item := range items {
		itemWhat := fmt.Sprintf("%s[%d]", what, i)
		fields, err := p.fields(item, itemWhat, "ports", "rules", "serverNames", "listener", "terminatingTLS", "originatingTLS")
		if err != nil {
			return nil, nil, err
		}
		if err := p.unsupportedField(item, itemWhat, ciliumPortRuleUnsupported); err != nil {
			return nil, nil, err
		}
		names, err := p.l7Rules(item, itemWhat, dir, deny)
		if err != nil {
			return nil, nil, err
		}
		portsNode, ok := fields.get("ports")
		if !ok {
			return nil, nil, p.errorf(item, "%s: ports is required", itemWhat)
		}
		portItems, err := p.nonEmptyList(portsNode, itemWhat+".ports")
		if err != nil {
			return nil, nil, err
		}
		if count := portsNode.Len(); count > maxPortsPerRule {
			return nil, nil, p.errorf(portsNode, "%s.ports: %d ports, at most %d (as Cilium)", itemWhat, count, maxPortsPerRule)
		}
		var dnsPorts []policy.PortRange
		for j, portItem := range portItems {
			portWhat := fmt.Sprintf("%s.ports[%d]", itemWhat, j)
			more, err := p.ciliumPort(portItem, portWhat)
			if err != nil {
				return nil, nil, err
			}
			ports = append(ports, more...)
			if names != nil {
				checked, err := p.dnsPorts(portItem, portWhat, more)
				if err != nil {
					return nil, nil, err
				}
				dnsPorts = append(dnsPorts, checked...)
			}
		}
		if names != nil {
			dns = append(dns, policy.DNSRule{Ports: sortPorts(dnsPorts), Names: names})
		}
	}
	return sortPorts(ports), dns, nil
}

// ciliumPort parses {port, endPort, protocol}: port "0" is every port of
// the protocol (with an endPort N, ports 0..N); no protocol is ANY, which
// is TCP, UDP and SCTP.
func (p *parser) ciliumPort(n node, what string) ([]policy.PortRange, error) {
	fields, err := p.fields(n, what, "port", "endPort", "protocol")
	if err != nil {
		return nil, err
	}
	portNode, ok := fields.get("port")
	if !ok {
		return nil, p.errorf(n, "%s: port is required (\"0\" for every port)", what)
	}
	endNode, hasEnd := fields.get("endPort")
	start, end, err := p.portRange(portNode, endNode, hasEnd, what)
	if err != nil {
		return nil, err
	}
	protocols, err := p.portProtocols(&fields, what, []policy.Protocol{policy.ProtocolTCP, policy.ProtocolUDP, policy.ProtocolSCTP}, true,
		"want TCP, UDP, SCTP or ANY (ICMP goes in icmps)")
	if err != nil {
		return nil, err
	}
	return portRanges(protocols, start, end), nil
}

// portRange parses a port (a number; named ports are rejected: this
// agent knows no pod's ports) and an optional endPort at least as large.
// An endPort equal to the port is the port alone (end 0); port 0 to
// endPort N is ports 0..N, as Cilium enforces it (to 65535: every port,
// as port 0 alone). endPort is an
// integer in Cilium's and Kubernetes' APIs alike, so a quoted one is
// rejected, as their API servers reject it.
func (p *parser) portRange(portNode, endNode node, hasEnd bool, what string) (start, end uint16, err error) {
	port, ok := number(portNode, maxPortNumber)
	if !ok {
		s, err := p.scalar(portNode, what+".port")
		if err != nil {
			return 0, 0, err
		}
		if strings.ContainsFunc(s, func(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }) {
			return 0, 0, p.errorf(portNode, "%s.port: %q: named ports are not supported (this agent knows no pod's ports), write the number", what, s)
		}
		return 0, 0, p.errorf(portNode, "%s.port: %q is not a port number (0..65535, decimal)", what, s)
	}
	if !hasEnd {
		return uint16(port), 0, nil
	}
	endPort, ok := number(endNode, maxPortNumber)
	switch {
	case ok && isString(endNode):
		return 0, 0, p.errorf(endNode, "%s.endPort: %q is a string, endPort is an integer: write it without quotes", what, endNode.Value())
	case !ok:
		return 0, 0, p.errorf(endNode, "%s.endPort: %q is not a port number (1..65535, decimal)", what, endNode.Value())
	case port == 0 && endPort == maxPortNumber:
		// Every port, as port 0 alone: one form in the model.
		return 0, 0, nil
	case endPort < port:
		return 0, 0, p.errorf(endNode, "%s.endPort: %d is below port %d", what, endPort, port)
	case endPort == port:
		return uint16(port), 0, nil
	}
	return uint16(port), uint16(endPort), nil
}

func portRanges(protocols []policy.Protocol, start, end uint16) []policy.PortRange {
	out := make([]policy.PortRange, len(protocols))
	for i, protocol := range protocols {
		out[i] = policy.PortRange{Protocol: protocol, Port: start, EndPort: end}
	}
	return out
}

// sortPorts sorts by protocol, port and end port, without duplicates.
func sortPorts(ports []policy.PortRange) []policy.PortRange {
	slices.SortFunc(ports, func(a, b policy.PortRange) int {
		if a.Protocol != b.Protocol {
			return cmp.Compare(a.Protocol, b.Protocol)
		}
		if a.Port != b.Port {
			return cmp.Compare(a.Port, b.Port)
		}
		return cmp.Compare(a.EndPort, b.EndPort)
	})
	return slices.Compact(ports)
}

// icmpRules parses icmps: a list of {fields: [{type, family}]}.
func (p *parser) icmpRules(n node, what string) ([]policy.PortRange, error) {
	items, err := p.nonEmptyList(n, what)
	if err != nil {
		return nil, err
	}
	var ports []policy.PortRange
	for i, item := range items {
		itemWhat := fmt.Sprintf("%s[%d]", what, i)
		fields, err := p.fields(item, itemWhat, "fields")
		if err != nil {
			return nil, err
		}
		fieldsNode, ok := fields.get("fields")
		if !ok {
			return nil, p.errorf(item, "%s: fields is required", itemWhat)
		}
		icmpFields, err := p.nonEmptyList(fieldsNode, itemWhat+".fields")
		if err != nil {
			return nil, err
		}
		if count := fieldsNode.Len(); count > maxICMPPerRule {
			return nil, p.errorf(fieldsNode, "%s.fields: %d types, at most %d (as Cilium)", itemWhat, count, maxICMPPerRule)
		}
		for j, field := range icmpFields {
			port, err := p.icmpField(field, fmt.Sprintf("%s.fields[%d]", itemWhat, j))
			if err != nil {
				return nil, err
			}
			ports = append(ports, port)
		}
	}
	return sortPorts(ports), nil
}

// icmpField parses {type, family}: the type as a number or Cilium's name
// of it, the family IPv4 (the default) or IPv6.
func (p *parser) icmpField(n node, what string) (policy.PortRange, error) {
	fields, err := p.fields(n, what, "type", "family")
	if err != nil {
		return policy.PortRange{}, err
	}
	protocol, names := policy.ProtocolICMP, icmpTypes
	if familyNode, ok := fields.get("family"); ok {
		family, err := p.scalar(familyNode, what+".family")
		if err != nil {
			return policy.PortRange{}, err
		}
		switch family {
		case "IPv4":
		case "IPv6":
			protocol, names = policy.ProtocolICMPv6, icmpv6Types
		default:
			return policy.PortRange{}, p.errorf(familyNode, "%s.family: %q: want IPv4 or IPv6", what, family)
		}
	}
	typeNode, ok := fields.get("type")
	if !ok {
		return policy.PortRange{}, p.errorf(n, "%s: type is required", what)
	}
	if t, ok := number(typeNode, maxICMPType); ok {
		return policy.PortRange{Protocol: protocol, Port: uint16(t)}, nil
	}
	name, err := p.scalar(typeNode, what+".type")
	if err != nil {
		return policy.PortRange{}, err
	}
	t, ok := names[name]
	if !ok {
		return policy.PortRange{}, p.errorf(typeNode, "%s.type: %q is not an %s type (0..255 or its name)", what, name, protocol)
	}
	return policy.PortRange{Protocol: protocol, Port: t}, nil
}
