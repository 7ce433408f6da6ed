// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

// Direction is the direction of traffic a rule applies to, seen from the
// endpoint. Its values are the policy map's (docs/CONTRACT.md, "BPF maps and pins").
type Direction uint8

const (
	// Ingress is traffic to the endpoint, matched by source address.
	Ingress Direction = 0
	// Egress is traffic from the endpoint, matched by destination address.
	Egress Direction = 1
)

// Directions lists both directions, in map order.
func Directions() []Direction { return []Direction{Ingress, Egress} }

// String returns "ingress" or "egress".
func (d Direction) String() string {
	switch d {
	case Ingress:
		return "ingress"
	case Egress:
		return "egress"
	}
	return "direction(" + strconv.Itoa(int(d)) + ")"
}

// ParseDirection parses "ingress" or "egress".
//
// Possible errors: an unknown direction.
func ParseDirection(s string) (Direction, error) {
	switch s {
	case "ingress":
		return Ingress, nil
	case "egress":
		return Egress, nil
	}
	return 0, fmt.Errorf("direction %q: want ingress or egress", s)
}

// Protocol is an IP protocol number as in the policy map; ProtocolAny (0)
// matches every protocol.
type Protocol uint8

const (
	ProtocolAny    Protocol = 0
	ProtocolICMP   Protocol = 1
	ProtocolTCP    Protocol = 6
	ProtocolUDP    Protocol = 17
	ProtocolICMPv6 Protocol = 58
	ProtocolSCTP   Protocol = 132
)

// String returns the protocol's name (TCP, UDP, SCTP, ICMP, ICMPv6) or
// "any", else the number.
func (p Protocol) String() string {
	switch p {
	case ProtocolAny:
		return "any"
	case ProtocolICMP:
		return "ICMP"
	case ProtocolTCP:
		return "TCP"
	case ProtocolUDP:
		return "UDP"
	case ProtocolICMPv6:
		return "ICMPv6"
	case ProtocolSCTP:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// PacketString names the protocol of a packet or a connection, as the
// monitor and conntrack show it: as String, but 0 by its number (in a
// packet it is no "any protocol").
func (p Protocol) PacketString() string {
	if p == ProtocolAny {
		return "0"
	}
	return p.String()
}

// ParseProtocol parses a name String returns (case-insensitive) or a
// protocol number.
//
// Possible errors: an unknown protocol name or a number out of range.
func ParseProtocol(s string) (Protocol, error) {
	for _, p := range []Protocol{ProtocolAny, ProtocolICMP, ProtocolTCP, ProtocolUDP, ProtocolICMPv6, ProtocolSCTP} {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("protocol %q: want TCP, UDP, SCTP, ICMP, ICMPv6, any or a number", s)
	}
	return Protocol(n), nil
}

// PortRange is what a rule matches of a packet above IP: a protocol and,
// for TCP, UDP and SCTP, the destination ports Port..EndPort (EndPort 0:
// Port alone; Port 0 alone or to 65535: every port of the protocol; Port
// 0 to EndPort N: ports 0..N, as Cilium's); for ICMP and ICMPv6,
// the message type in Port (EndPort 0). Protocol is never ProtocolAny: a
// rule's "any protocol" port is one PortRange per protocol it stands for.
type PortRange struct {
	Protocol Protocol `json:"protocol" yaml:"protocol"`
	Port     uint16   `json:"port" yaml:"port"`
	EndPort  uint16   `json:"endPort,omitempty" yaml:"endPort,omitempty"`
}

// String returns "port/protocol", "port-endport/protocol", "any/protocol"
// or, for ICMP, "type N/ICMP".
func (pr PortRange) String() string {
	switch {
	case pr.Protocol == ProtocolICMP || pr.Protocol == ProtocolICMPv6:
		return fmt.Sprintf("type %d/%s", pr.Port, pr.Protocol)
	case pr.Port == 0 && (pr.EndPort == 0 || pr.EndPort == math.MaxUint16):
		return "any/" + pr.Protocol.String()
	case pr.EndPort != 0 && pr.EndPort != pr.Port:
		return fmt.Sprintf("%d-%d/%s", pr.Port, pr.EndPort, pr.Protocol)
	}
	return fmt.Sprintf("%d/%s", pr.Port, pr.Protocol)
}

// CIDRSelector selects the identities with a cidr label inside CIDR, minus
// those with a cidr label inside one of the Except prefixes (which lie
// inside CIDR). The all-addresses CIDRs also select world.
type CIDRSelector struct {
	CIDR   netip.Prefix   `json:"cidr" yaml:"cidr"`
	Except []netip.Prefix `json:"except,omitempty" yaml:"except,omitempty"`
}

// excludes reports whether one of the prefixes lies inside an except
// prefix.
func (s *CIDRSelector) Excludes(prefixes []netip.Prefix) bool {
	for _, except := range s.Except {
		for _, prefix := range prefixes {
			if prefixkey.Inside(except, prefix) {
				return true
			}
		}
	}
	return false
}

// Selects reports whether the selector selects an identity whose cidr
// labels name the given prefixes.
func (s *CIDRSelector) Selects(prefixes []netip.Prefix) bool {
	return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return prefixkey.Inside(s.CIDR, p) }) &&
		!s.Excludes(prefixes)
}

// Rule allows (or, if Deny, drops) traffic in one direction to or from
// the identities its peers select.
type Rule struct {
	// Deny rules drop what they match, whatever any allow rule says.
	Deny bool `json:"deny,omitempty" yaml:"deny,omitempty"`

	// Peers select remote identities by CIDR. AnyPeer selects every remote
	// identity (a rule with ports and no peers, or the entity "all"): the
	// policy map's identity 0. A rule with neither selects nothing; it
	// still makes its direction enforced (Cilium's `ingress: [{}]`).
	Peers   []CIDRSelector `json:"peers,omitempty" yaml:"peers,omitempty"`
	AnyPeer bool           `json:"anyPeer,omitempty" yaml:"anyPeer,omitempty"`

	// Endpoints select remote identities by their labels: the endpoint
	// identities, local or remote, that one of them matches
	// (EndpointSelector.SelectsPeer). fromEndpoints, toEndpoints and a
	// NetworkPolicy's podSelector and namespaceSelector peers.
	Endpoints []EndpointSelector `json:"endpoints,omitempty" yaml:"endpoints,omitempty"`

	// Entities select the identities of entities other than world and
	// all (which are Peers and AnyPeer): each the identities labelled
	// with its reserved label and its reserved number; cluster is every
	// endpoint identity and the entities of identity.ClusterEntities.
	Entities []identity.Entity `json:"entities,omitempty" yaml:"entities,omitempty"`

	// FQDN is the rule's toFQDNs and DNS rules (egress allow rules
	// only, as Cilium), nil when it has neither: most rules, which a
	// pointer keeps as small as they were.
	FQDN *FQDNRule `json:"fqdn,omitempty" yaml:"fqdn,omitempty"`

	// Ports are sorted and distinct. Empty: every protocol and port
	// (ICMP included).
	Ports []PortRange `json:"ports,omitempty" yaml:"ports,omitempty"`

	// NoDefaultDeny is set when the rule's policy (or its spec) says
	// `enableDefaultDeny: {<direction>: false}`: the rule does not make
	// its direction enforced (docs/CONTRACT.md, "Policy semantics").
	NoDefaultDeny bool `json:"noDefaultDeny,omitempty" yaml:"noDefaultDeny,omitempty"`

	// Name names the rule within its policy, as the file spells its place:
	// "egress[0]", "ingressDeny[1]", "specs[2].egress[0]"; Line is the
	// line it starts at (and Column its column, for errors about the
	// whole rule). For explain and list.
	Name   string `json:"name,omitempty" yaml:"name,omitempty"`
	Line   int    `json:"line,omitempty" yaml:"line,omitempty"`
	Column int    `json:"column,omitempty" yaml:"column,omitempty"`
}

// FQDNRule is what a rule says of DNS names.
type FQDNRule struct {
	// Selectors select remote addresses by the DNS names they were
	// resolved from (toFQDNs): the addresses the DNS proxy learns from
	// the answers to the endpoints' queries. A rule with Selectors has
	// no other kind of peer, and its Ports apply to the learned
	// addresses (it is never AnyPeer).
	Selectors []fqdn.Selector `json:"selectors,omitempty" yaml:"selectors,omitempty"`

	// DNS are the rule's DNS rules (toPorts[].rules.dns): its DNS
	// traffic to its peers on their ports goes through the DNS proxy,
	// which forwards the queries for the names they allow and refuses
	// the others. Their ports are in the rule's Ports too: the rule
	// allows them at L4 as any port.
	DNS []DNSRule `json:"dns,omitempty" yaml:"dns,omitempty"`
}

// Equal reports whether two FQDN rules say the same (nil: nothing).
func (f *FQDNRule) Equal(other *FQDNRule) bool {
	if f == nil || other == nil {
		return f == other
	}
	return slices.Equal(f.Selectors, other.Selectors) &&
		slices.EqualFunc(f.DNS, other.DNS, func(a, b DNSRule) bool {
			return slices.Equal(a.Ports, b.Ports) && slices.Equal(a.Names, b.Names)
		})
}

// DNSRule is one toPorts entry's DNS rules: on Ports (single ports, TCP
// or UDP, as Cilium requires of DNS rules), the queries for a name one
// of Names matches are forwarded. Names is not empty; a pattern "*"
// allows every name, which still makes the proxy learn the answers.
type DNSRule struct {
	Ports []PortRange     `json:"ports" yaml:"ports"`
	Names []fqdn.Selector `json:"names" yaml:"names"`
}

// Policy is one document of a policy file, validated. Policies are
// immutable once parsed.
type Policy struct {
	// Name is unique among the policies in force.
	Name string `json:"name" yaml:"name"`
	// File is the name of the file in the policy directory that holds the
	// policy, and Line the line of its name there.
	File string `json:"file" yaml:"file"`
	Line int    `json:"line" yaml:"line"`
	// Kind is the document's format: KindNative, KindCNP, KindCCNP or
	// KindNetworkPolicy.
	Kind string `json:"kind,omitempty" yaml:"kind,omitempty"`

	// Selector picks the local endpoints the policy applies to; empty, it
	// also applies to the host-wide default.
	Selector EndpointSelector `json:"selector" yaml:"selector"`

	// Ingress and Egress hold the allow and deny rules of a direction.
	Ingress []Rule `json:"ingress,omitempty" yaml:"ingress,omitempty"`
	Egress  []Rule `json:"egress,omitempty" yaml:"egress,omitempty"`
}

// The kinds of policy documents (docs/CONTRACT.md, "Policy file formats").
const (
	KindNative        = "native"
	KindCNP           = "CiliumNetworkPolicy"
	KindCCNP          = "CiliumClusterwideNetworkPolicy"
	KindNetworkPolicy = "NetworkPolicy"
)

// Rules returns the rules of one direction.
func (p *Policy) Rules(dir Direction) []Rule {
	if dir == Ingress {
		return p.Ingress
	}
	return p.Egress
}

// Resource returns the name of the policy's ipcache resource.
func (p *Policy) Resource() string { return ResourcePrefix + p.Name }

// ResourcePrefix starts the ipcache resource name of every policy.
const ResourcePrefix = "policy/"

// Prefixes returns the distinct CIDRs and except prefixes of the policy,
// sorted: what the policy puts into the ipcache.
func (p *Policy) Prefixes() []netip.Prefix {
	n := 0
	for _, dir := range Directions() {
		for _, rule := range p.Rules(dir) {
			for _, peer := range rule.Peers {
				n += 1 + len(peer.Except)
			}
		}
	}
	if n == 0 {
		return nil
	}
	// Made at its size: a policy may have a hundred thousand CIDRs.
	prefixes := make([]netip.Prefix, 0, n)
	for _, dir := range Directions() {
		for _, rule := range p.Rules(dir) {
			for _, peer := range rule.Peers {
				prefixes = append(prefixes, peer.CIDR)
				prefixes = append(prefixes, peer.Except...)
			}
		}
	}
	slices.SortFunc(prefixes, prefixkey.Compare)
	return slices.Compact(prefixes)
}

// sameRules reports whether two policies allow the same traffic to the
// same endpoints (whatever their name and file).
func (p *Policy) SameRules(other *Policy) bool {
	if p == other {
		return true
	}
	return p.Selector.Equal(&other.Selector) && slices.EqualFunc(p.Ingress, other.Ingress, Rule.Equal) &&
		slices.EqualFunc(p.Egress, other.Egress, Rule.Equal)
}

// equal reports whether two policies are the same in every field.
func (p *Policy) Equal(other *Policy) bool {
	if p == other {
		return true
	}
	return p.Name == other.Name && p.File == other.File && p.Line == other.Line && p.Kind == other.Kind &&
		p.SameRules(other)
}

func (r Rule) Equal(other Rule) bool {
	return r.Deny == other.Deny && r.AnyPeer == other.AnyPeer && r.NoDefaultDeny == other.NoDefaultDeny &&
		r.Name == other.Name && r.Line == other.Line && r.Column == other.Column && slices.Equal(r.Ports, other.Ports) &&
		slices.EqualFunc(r.Peers, other.Peers, func(a, b CIDRSelector) bool {
			return a.CIDR == b.CIDR && slices.Equal(a.Except, b.Except)
		}) && slices.Equal(r.Entities, other.Entities) &&
		slices.EqualFunc(r.Endpoints, other.Endpoints, func(a, b EndpointSelector) bool { return a.Equal(&b) }) &&
		r.FQDN.Equal(other.FQDN)
}

// TableHeader implements statedb.TableWritable.
func (*Policy) TableHeader() []string {
	return []string{"Name", "File", "Line", "Ingress", "Egress", "Prefixes"}
}

// TableRow implements statedb.TableWritable. Ingress and Egress are the
// number of rules.
func (p *Policy) TableRow() []string {
	return []string{p.Name, p.File, strconv.Itoa(p.Line), strconv.Itoa(len(p.Ingress)),
		strconv.Itoa(len(p.Egress)), strconv.Itoa(len(p.Prefixes()))}
}

// appendKeys appends the policy-map keys of the range to out, each base
// with the range's protocol and one aligned block of its ports: a single
// port is one key; port..endPort the fewest aligned blocks that cover it
// exactly, as Cilium splits ranges for its LPM policy map (port 0 to N
// below 65535 too: ports 0..N); port 0 (alone or to 65535) every port of
// the protocol; an ICMP type the type in the port's high byte, any code.
func (pr PortRange) AppendKeys(out []Key, base Key) []Key {
	base.Protocol = pr.Protocol
	switch {
	case pr.Protocol == ProtocolICMP || pr.Protocol == ProtocolICMPv6:
		base.Port, base.PortWildcardBits = pr.Port<<8, 8
		return append(out, base)
	case pr.Port == 0 && (pr.EndPort == 0 || pr.EndPort == math.MaxUint16):
		base.Port, base.PortWildcardBits = 0, 16
		return append(out, base)
	case pr.EndPort <= pr.Port:
		base.Port, base.PortWildcardBits = pr.Port, 0
		return append(out, base)
	}
	// From the start up: the largest block aligned at the current port
	// that does not pass the end. uint32: the last block may end at 65535.
	for port, end := uint32(pr.Port), uint32(pr.EndPort); port <= end; {
		wildcard := uint8(min(bits.TrailingZeros32(port), 16))
		for port+(1<<wildcard)-1 > end {
			wildcard--
		}
		base.Port, base.PortWildcardBits = uint16(port), wildcard
		out = append(out, base)
		port += 1 << wildcard
	}
	return out
}
