// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The monitor's filters follow hubble observe's: each flag may be given
// several times (or with comma-separated values), and an event passes a
// flag when it matches any of its values; it is shown when it passes
// every flag given. They apply to the decoded events, in the agent: the
// program writes (and the lost-event counters count) every event, as
// without filters.

// Filter flag names, as `monitor` takes them on the shell and on the
// command line.
const (
	flagFromIP       = "from-ip"
	flagToIP         = "to-ip"
	flagIP           = "ip"
	flagFromPort     = "from-port"
	flagToPort       = "to-port"
	flagPort         = "port"
	flagProtocol     = "protocol"
	flagVerdict      = "verdict"
	flagFromIdentity = "from-identity"
	flagToIdentity   = "to-identity"
	flagIdentity     = "identity"
	flagLabel        = "label"
	flagEndpoint     = "endpoint"
)

// filterFlagNames are the filter flags in the order help lists them.
var filterFlagNames = []string{flagFromIP, flagToIP, flagIP, flagFromPort, flagToPort, flagPort, flagProtocol,
	flagVerdict, flagFromIdentity, flagToIdentity, flagIdentity, flagLabel, flagEndpoint}

// AddFilterFlags adds the monitor's filter flags to fs, for the shell's
// monitor and the agent's `monitor` command, which passes them on
// ([FilterArgs]).
func AddFilterFlags(fs *pflag.FlagSet) {
	fs.StringSlice(flagFromIP, nil, "Show events whose source address is this address or in this CIDR")
	fs.StringSlice(flagToIP, nil, "Show events whose destination address is this address or in this CIDR")
	fs.StringSlice(flagIP, nil, "Show events whose source or destination address is this address or in this CIDR")
	fs.StringSlice(flagFromPort, nil, "Show events whose source port (TCP, UDP, SCTP) is this port")
	fs.StringSlice(flagToPort, nil, "Show events whose destination port (TCP, UDP, SCTP) is this port")
	fs.StringSlice(flagPort, nil, "Show events whose source or destination port (TCP, UDP, SCTP) is this port")
	fs.StringSlice(flagProtocol, nil, "Show events of this protocol: tcp, udp, icmp, icmpv6, sctp or a number")
	fs.StringSlice(flagVerdict, nil, "Show events of this verdict (drop, allow) or reason (no-policy, policy-deny, policy, reply, ...); DNS: refused, failed")
	fs.StringSlice(flagFromIdentity, nil, "Show events whose source's identity is this number")
	fs.StringSlice(flagToIdentity, nil, "Show events whose destination's identity is this number")
	fs.StringSlice(flagIdentity, nil, "Show events whose source's or destination's identity is this number")
	fs.StringSlice(flagLabel, nil, "Show events where either side's identity has this label (k8s:app=web, reserved:world)")
	fs.StringSlice(flagEndpoint, nil, "Show events of this local endpoint (namespace/name)")
}

// FilterArgs returns the filter flags set on fs as arguments for the
// shell's monitor, each value single-quoted for the shell's parser.
func FilterArgs(fs *pflag.FlagSet) []string {
	var args []string
	for _, name := range filterFlagNames {
		if !fs.Changed(name) {
			continue
		}
		values, _ := fs.GetStringSlice(name)
		for _, v := range values {
			args = append(args, "--"+name+"='"+strings.ReplaceAll(v, "'", "''")+"'")
		}
	}
	return args
}

// Filter is a monitor client's filters, parsed: an empty Filter passes
// every event.
type Filter struct {
	fromIP, toIP, ip                []netip.Prefix
	fromPort, toPort, port          []uint16
	protocols                       []uint8
	verdicts                        []verdict
	fromIdentity, toIdentity, anyID []identity.Number
	labels                          []string
	endpoints                       []string
}

// verdict is one --verdict value: an event's verdict, or one reason, or
// one of a DNS event's.
type verdict struct {
	allowed bool
	reason  bpfmaps.Reason    // 0: any reason of the verdict
	dns     events.DNSVerdict // 0: not a DNS event's own (refused, failed)
}

// matchesDNS reports whether a DNS event of verdict d passes v: allow is
// forwarded, drop refused or failed; a reason passes none.
func (v verdict) matchesDNS(d events.DNSVerdict) bool {
	if v.dns != 0 {
		return v.dns == d
	}
	return v.reason == 0 && v.allowed == (d == events.DNSForwarded)
}

// ParseFilter parses the filter flags of fs.
//
// Possible errors: ErrFilter (wrapped, naming the flag and the value);
// a filter flag missing from fs (not added by AddFilterFlags).
func ParseFilter(fs *pflag.FlagSet) (*Filter, error) {
	f := &Filter{}
	for _, name := range filterFlagNames {
		values, err := fs.GetStringSlice(name)
		if err != nil {
			return nil, err
		}
		for _, v := range values {
			if err := f.add(name, v); err != nil {
				return nil, fmt.Errorf("--%s %q: %w: %w", name, v, ErrFilter, err)
			}
		}
	}
	return f, nil
}

func (f *Filter) add(name, v string) error {
	switch name {
	case flagFromIP, flagToIP, flagIP:
		p, err := parsePrefix(v)
		if err != nil {
			return err
		}
		dst := map[string]*[]netip.Prefix{flagFromIP: &f.fromIP, flagToIP: &f.toIP, flagIP: &f.ip}[name]
		*dst = append(*dst, p)
	case flagFromPort, flagToPort, flagPort:
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return fmt.Errorf("want a port 0..65535")
		}
		dst := map[string]*[]uint16{flagFromPort: &f.fromPort, flagToPort: &f.toPort, flagPort: &f.port}[name]
		*dst = append(*dst, uint16(n))
	case flagProtocol:
		p, err := policy.ParseProtocol(v)
		if err != nil || p == policy.ProtocolAny {
			return fmt.Errorf("want tcp, udp, icmp, icmpv6, sctp or a number 1..255")
		}
		f.protocols = append(f.protocols, uint8(p))
	case flagVerdict:
		vd, err := parseVerdict(v)
		if err != nil {
			return err
		}
		f.verdicts = append(f.verdicts, vd)
	case flagFromIdentity, flagToIdentity, flagIdentity:
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("want an identity number 1..4294967295")
		}
		dst := map[string]*[]identity.Number{flagFromIdentity: &f.fromIdentity, flagToIdentity: &f.toIdentity, flagIdentity: &f.anyID}[name]
		*dst = append(*dst, identity.Number(n))
	case flagLabel:
		if _, err := labels.New(v); err != nil {
			return err
		}
		f.labels = append(f.labels, v)
	case flagEndpoint:
		ns, n, ok := strings.Cut(v, "/")
		if !ok || ns == "" || n == "" || strings.Contains(n, "/") {
			return fmt.Errorf("want namespace/name")
		}
		f.endpoints = append(f.endpoints, v)
	}
	return nil
}

// parsePrefix parses an address (its /32 or /128) or a CIDR.
func parsePrefix(v string) (netip.Prefix, error) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("want an address or a CIDR")
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("want an address or a CIDR")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseVerdict parses drop, allow (and hubble's dropped, allowed,
// forwarded) or a reason's name (docs/CONTRACT.md "Monitor events").
func parseVerdict(v string) (verdict, error) {
	switch strings.ToLower(v) {
	case "drop", "dropped":
		return verdict{}, nil
	case "allow", "allowed", "forwarded":
		return verdict{allowed: true}, nil
	case "refused":
		return verdict{dns: events.DNSRefused}, nil
	case "failed":
		return verdict{dns: events.DNSFailed}, nil
	}
	for code := 1; code < 256; code++ {
		r := bpfmaps.Reason(code)
		if name := r.String(); name == v && !strings.HasPrefix(name, "reason-") {
			return verdict{allowed: r >= bpfmaps.ReasonPolicy, reason: r}, nil
		}
	}
	return verdict{}, fmt.Errorf("want drop, allow, a reason (no-policy, policy-deny, spoofed-source, policy, reply, ...), refused or failed")
}

// kinds returns the events the filter can pass, for a client that gave no
// --type: a --verdict of allowed packets' asks for verdict events, one of
// DNS events' own (refused, failed) for DNS events.
func (f *Filter) kinds() events.Kinds {
	if len(f.verdicts) == 0 {
		return events.Drops
	}
	var k events.Kinds
	for _, v := range f.verdicts {
		if v.dns != 0 {
			k |= events.DNSQueries
		} else if v.allowed {
			k |= events.Verdicts
		} else {
			k |= events.Drops
		}
	}
	return k
}

// sides is what a filter needs of an event beyond the event itself, from
// the agent's tables: the labels of an identity and the name of the
// event's local endpoint.
type sides interface {
	identityLabels(identity.Number) []string
	endpointName(events.Event) string
}

// match reports whether e passes every filter given; names are looked up
// only for --label and --endpoint.
func (f *Filter) match(e events.Event, names sides) bool {
	srcID, dstID := e.Endpoint, e.Identity
	if e.Direction == policy.Ingress {
		srcID, dstID = e.Identity, e.Endpoint
	}
	hasPorts := e.Protocol == uint8(policy.ProtocolTCP) || e.Protocol == uint8(policy.ProtocolUDP) ||
		e.Protocol == uint8(policy.ProtocolSCTP)
	inAny := func(ps []netip.Prefix, addrs ...netip.Addr) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool {
			return slices.ContainsFunc(addrs, func(a netip.Addr) bool { return a.IsValid() && p.Contains(a.Unmap()) })
		})
	}
	portIn := func(ps []uint16, ports ...uint16) bool {
		return hasPorts && slices.ContainsFunc(ps, func(p uint16) bool { return slices.Contains(ports, p) })
	}
	idIn := func(ids []identity.Number, of ...identity.Number) bool {
		// 0 is no identity: the host-wide default's side, a malformed
		// packet's remote one.
		return slices.ContainsFunc(ids, func(n identity.Number) bool { return slices.Contains(of, n) })
	}
	switch {
	case len(f.fromIP) > 0 && !inAny(f.fromIP, e.Src),
		len(f.toIP) > 0 && !inAny(f.toIP, e.Dst),
		len(f.ip) > 0 && !inAny(f.ip, e.Src, e.Dst),
		len(f.fromPort) > 0 && !portIn(f.fromPort, e.SrcPort),
		len(f.toPort) > 0 && !portIn(f.toPort, e.DstPort),
		len(f.port) > 0 && !portIn(f.port, e.SrcPort, e.DstPort),
		len(f.protocols) > 0 && !slices.Contains(f.protocols, e.Protocol),
		len(f.verdicts) > 0 && !slices.ContainsFunc(f.verdicts, func(v verdict) bool {
			return v.dns == 0 && v.allowed == e.Allowed && (v.reason == 0 || v.reason == e.Reason)
		}),
		len(f.fromIdentity) > 0 && !idIn(f.fromIdentity, srcID),
		len(f.toIdentity) > 0 && !idIn(f.toIdentity, dstID),
		len(f.anyID) > 0 && !idIn(f.anyID, srcID, dstID):
		return false
	}
	if len(f.labels) > 0 {
		has := func(id identity.Number) bool {
			return id != identity.Unknown && slices.ContainsFunc(names.identityLabels(id), func(l string) bool {
				return slices.Contains(f.labels, l)
			})
		}
		if !has(e.Identity) && !has(e.Endpoint) {
			return false
		}
	}
	if len(f.endpoints) > 0 && (e.Endpoint == identity.Unknown || !slices.Contains(f.endpoints, names.endpointName(e))) {
		return false
	}
	return true
}

// matchDNS reports whether a DNS event passes every filter given: the
// client is its source, the server its destination, its endpoint the
// client's; a port, protocol or identity filter passes none (the proxy's
// event has no packet's ports or remote identity).
func (f *Filter) matchDNS(e events.DNS, names sides) bool {
	if len(f.fromPort) > 0 || len(f.toPort) > 0 || len(f.port) > 0 || len(f.protocols) > 0 ||
		len(f.fromIdentity) > 0 || len(f.toIdentity) > 0 || len(f.anyID) > 0 {
		return false
	}
	client, server := e.Client.Addr().Unmap(), e.Server.Addr().Unmap()
	inAny := func(ps []netip.Prefix, addrs ...netip.Addr) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool {
			return slices.ContainsFunc(addrs, func(a netip.Addr) bool { return a.IsValid() && p.Contains(a) })
		})
	}
	switch {
	case len(f.fromIP) > 0 && !inAny(f.fromIP, client),
		len(f.toIP) > 0 && !inAny(f.toIP, server),
		len(f.ip) > 0 && !inAny(f.ip, client, server),
		len(f.verdicts) > 0 && !slices.ContainsFunc(f.verdicts, func(v verdict) bool { return v.matchesDNS(e.Verdict) }):
		return false
	}
	if len(f.labels) > 0 && (e.Endpoint == identity.Unknown || !slices.ContainsFunc(names.identityLabels(e.Endpoint),
		func(l string) bool { return slices.Contains(f.labels, l) })) {
		return false
	}
	if len(f.endpoints) > 0 && (e.Endpoint == identity.Unknown || !slices.Contains(f.endpoints, names.endpointName(queryPacket(e)))) {
		return false
	}
	return true
}
