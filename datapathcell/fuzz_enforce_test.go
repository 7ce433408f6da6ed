// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// FuzzEnforceParser runs random frames through both entry points of the
// enforcement program (BPF_PROG_RUN) with both directions enforced with
// default deny, fixed ipcache and policy maps (parserFuzzIPCache,
// parserFuzzPolicy), and an empty conntrack and fragments map before every
// run, so that no frame can pass as a reply, a related ICMP error, an
// established connection or a later fragment. Any frame the program
// passes must then be explained by an oracle written independently in Go
// (parserOracle): not IP by its EtherType, on-link neighbour discovery, or
// a packet whose protocol, port and remote identity policy allows.
//
// The oracle predicts every verdict, but only a pass it does not predict
// fails the target: a drop it does not predict is fail-closed. With
// IPCACHE_AGENT_FUZZ_STRICT=1 those fail too, which checks the oracle
// against the program.
//
// BPF_PROG_RUN runs the frame as a linear skb on the loopback (ifindex
// 1), and refuses IP frames shorter than the fixed IP header (those are
// not run): the program's reads through bpf_skb_load_bytes of a
// non-linear part are not exercised, and the FIB lookup of neighbour discovery
// (ndp_on_link) sees the loopback, whose forwarding is normally off, so
// that every neighbour discovery message to or from a unicast address
// passes: the oracle takes the message's shape, and a multicast remote's
// scope (which the program reads, not the FIB), as the explanation.
func FuzzEnforceParser(f *testing.F) {
	privileged.Test(f)
	for _, seed := range parserFuzzSeeds() {
		f.Add(seed)
	}
	h := newParserFuzzHarness(f)
	strict := os.Getenv("IPCACHE_AGENT_FUZZ_STRICT") == "1"
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !progRunAccepts(frame) {
			return
		}
		for _, direction := range []policy.Direction{policy.Egress, policy.Ingress} {
			h.clearState(t)
			ret := h.run(t, direction, frame)
			want := h.oracle.decide(frame, direction)
			switch {
			case ret != tcxNextRet && ret != tcxDropRet:
				t.Fatalf("%s: verdict %#x, neither TCX_NEXT nor TCX_DROP, for frame %x", direction, ret, frame)
			case ret == tcxNextRet && !want.pass:
				t.Fatalf("%s: the program passes a frame that nothing explains (oracle: drop, %s)\nframe %x", direction, want.why, frame)
			case strict && ret == tcxDropRet && want.pass:
				t.Fatalf("%s: the program drops a frame the oracle passes (%s)\nframe %x", direction, want.why, frame)
			}
		}
	})
}

// progRunAccepts says whether BPF_PROG_RUN takes frame: not less than an
// Ethernet header, not more than about a page, and (since Linux 6.x) not
// an IPv4 or IPv6 EtherType with less than the fixed IP header after it.
func progRunAccepts(frame []byte) bool {
	if len(frame) < 14 || len(frame) > 1518 {
		return false
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherTypeIPv4:
		return len(frame) >= 14+20
	case etherTypeIPv6:
		return len(frame) >= 14+40
	}
	return true
}

// parserFuzzHarness is the program loaded once per fuzz process, with its
// maps.
type parserFuzzHarness struct {
	maps      enforcerMaps
	enf       *enforcer
	fragments *ebpf.Map
	oracle    *parserOracle
}

const (
	testIdentityC = 1<<24 | 3
)

// The fuzz target's endpoints and remotes: ipcache prefixes of three
// identities, nested, and world outside them.
var (
	parserFuzzIPCache = []struct {
		prefix   string
		identity uint32
	}{
		{"10.1.0.0/16", testIdentityAllowed},
		{"10.1.2.0/24", testIdentityDenied},
		{"192.0.2.10/32", testIdentityAllowed},
		{"203.0.113.0/24", testIdentityC},
		{"fd00:1::/64", testIdentityAllowed},
		{"fd00:1::bad/128", testIdentityDenied},
		{"2001:db8::/32", testIdentityC},
	}
	fuzzEndpoint4 = netip.MustParseAddr("10.0.0.1")
	fuzzEndpoint6 = netip.MustParseAddr("fd00::1")
	fuzzRemoteA4  = netip.MustParseAddr("10.1.0.5")
	fuzzRemoteB4  = netip.MustParseAddr("10.1.2.7")
	fuzzRemoteC4  = netip.MustParseAddr("203.0.113.9")
	fuzzWorld4    = netip.MustParseAddr("198.51.100.1")
	fuzzRemoteA6  = netip.MustParseAddr("fd00:1::5")
	fuzzRemoteB6  = netip.MustParseAddr("fd00:1::bad")
	fuzzRemoteC6  = netip.MustParseAddr("2001:db8::9")
	fuzzWorld6    = netip.MustParseAddr("2001:dead::1")
)

// parserFuzzRule is a policy map entry: a key as the agent writes it and
// its verdict.
type parserFuzzRule struct {
	key     policy.Key
	verdict policy.Verdict
}

func fuzzRule(ident uint32, direction policy.Direction, protocol policy.Protocol, port uint16, wildcardBits uint8, verdict policy.Verdict) parserFuzzRule {
	return parserFuzzRule{
		key: policy.Key{
			Identity:         identity.Number(ident),
			Direction:        direction,
			Protocol:         protocol,
			Port:             port,
			PortWildcardBits: wildcardBits,
		},
		verdict: verdict,
	}
}

// parserFuzzPolicy: allows of one identity and TCP port, a UDP port range
// for any identity, ICMP and ICMPv6 types, a whole protocol and any
// protocol; denies of a port inside that range for one identity, a port
// inside an any-protocol allow, and a port for any identity. No allow is
// narrower than a deny of the same identity (the agent never writes one,
// docs/CONTRACT.md).
func parserFuzzPolicy() []parserFuzzRule {
	const allow, deny = policy.VerdictAllow, policy.VerdictDeny
	in, out := policy.Ingress, policy.Egress
	return []parserFuzzRule{
		fuzzRule(testIdentityAllowed, out, policy.ProtocolTCP, 80, 0, allow),
		fuzzRule(testIdentityAllowed, in, policy.ProtocolTCP, 22, 0, allow),
		fuzzRule(0, out, policy.ProtocolUDP, 5000, 3, allow), // 5000-5007
		fuzzRule(0, in, policy.ProtocolUDP, 5000, 3, allow),
		fuzzRule(testIdentityDenied, out, policy.ProtocolUDP, 5003, 0, deny),
		fuzzRule(testIdentityAllowed, in, policy.ProtocolICMP, 8<<8, 8, allow),     // echo request, any code
		fuzzRule(testIdentityAllowed, in, policy.ProtocolICMPv6, 128<<8, 8, allow), // echo request, any code
		fuzzRule(testIdentityAllowed, out, policy.ProtocolICMP, 3<<8|4, 0, allow),  // fragmentation needed
		fuzzRule(testIdentityC, out, policy.ProtocolICMPv6, 0, 16, allow),
		fuzzRule(testIdentityC, out, policy.ProtocolAny, 0, 0, allow),
		fuzzRule(testIdentityC, out, policy.ProtocolTCP, 23, 0, deny),
		fuzzRule(0, out, policy.ProtocolTCP, 8443, 0, deny),
		fuzzRule(testIdentityC, in, policy.ProtocolUDP, 0, 16, allow),
		fuzzRule(testIdentityWorld, out, policy.ProtocolTCP, 443, 0, allow),
		fuzzRule(testIdentityWorld, out, policy.ProtocolSCTP, 9000, 0, allow),
	}
}

func newParserFuzzHarness(tb testing.TB) *parserFuzzHarness {
	tb.Helper()
	newMap := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		require.NoError(tb, err, spec.Name)
		tb.Cleanup(func() { m.Close() })
		return m
	}
	maps := withSubjects(tb, enforcerMaps{
		IPCache:     newMap(bpfmaps.IPCacheSpec(64)),
		Policy:      newMap(bpfmaps.PolicySpec(64)),
		Enforcement: newMap(bpfmaps.EnforcementSpec()),
		Counters:    newMap(bpfmaps.CountersSpec()),
		Conntrack:   newMap(bpfmaps.ConntrackSpec(256)),
		Revision:    newMap(bpfmaps.RevisionSpec()),

		ConntrackOpening: newMap(bpfmaps.ConntrackOpeningSpec(256)),
	})
	oracle := &parserOracle{}
	for _, e := range parserFuzzIPCache {
		p := netip.MustParsePrefix(e.prefix)
		require.NoError(tb, maps.IPCache.Put(bpfmaps.NewIPCacheKey(p), bpfmaps.NewIPCacheValue(identity.Number(e.identity))))
		oracle.ipcache = append(oracle.ipcache, oracleIPCacheEntry{p, e.identity})
	}
	for _, r := range parserFuzzPolicy() {
		require.NoError(tb, maps.Policy.Put(bpfmaps.NewPolicyKey(r.key), bpfmaps.NewPolicyValue(uint32(r.verdict))))
		oracle.policy = append(oracle.policy, r)
	}
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		require.NoError(tb, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(0, d), uint32(bpfmaps.EnforceDefaultDeny)))
	}
	bumpRevision(tb, maps)

	e, err := loadEnforcer(maps)
	require.NoError(tb, err)
	tb.Cleanup(func() { e.Close() })
	return &parserFuzzHarness{maps: maps, enf: e, fragments: programMap(tb, e.fromEndpoint, "fragments"), oracle: oracle}
}

// programMap opens the map of prog named name (one the loader does not
// hand out).
func programMap(tb testing.TB, prog *ebpf.Program, name string) *ebpf.Map {
	tb.Helper()
	info, err := prog.Info()
	require.NoError(tb, err)
	ids, ok := info.MapIDs()
	require.True(tb, ok, "no map IDs of the program")
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		require.NoError(tb, err)
		mi, err := m.Info()
		require.NoError(tb, err)
		if mi.Name == name {
			tb.Cleanup(func() { m.Close() })
			return m
		}
		m.Close()
	}
	tb.Fatalf("the program has no map %s", name)
	return nil
}

// clearState empties conntrack and fragments.
func (h *parserFuzzHarness) clearState(tb testing.TB) {
	tb.Helper()
	for _, m := range []*ebpf.Map{h.maps.Conntrack, h.maps.ConntrackOpening, h.fragments} {
		var keys [][]byte
		key, value := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(key, value) {
			keys = append(keys, append([]byte(nil), key...))
		}
		require.NoError(tb, it.Err())
		for _, k := range keys {
			require.NoError(tb, m.Delete(k))
		}
	}
}

// run runs frame through the entry point of direction (the endpoint's).
func (h *parserFuzzHarness) run(tb testing.TB, direction policy.Direction, frame []byte) uint32 {
	tb.Helper()
	prog := h.enf.toEndpoint
	if direction == policy.Egress {
		prog = h.enf.fromEndpoint
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	require.NoError(tb, err, "BPF_PROG_RUN of %d bytes", len(frame))
	return ret
}

// parserOracle predicts the program's verdict on a frame in an enforced
// direction (default deny) with no conntrack or fragment state, from the
// rules of enforce.c's header comment, parsed here independently of the
// program's code.
type parserOracle struct {
	ipcache []oracleIPCacheEntry
	policy  []parserFuzzRule
}

type oracleIPCacheEntry struct {
	prefix   netip.Prefix
	identity uint32
}

// oracleVerdict is the oracle's prediction and why.
type oracleVerdict struct {
	pass bool
	why  string
}

// oraclePacket is what policy matches of a packet.
type oraclePacket struct {
	remote   netip.Addr
	protocol uint8
	hasPort  bool
	port     uint16 // ICMP: type << 8 | code
}

func (o *parserOracle) decide(frame []byte, direction policy.Direction) oracleVerdict {
	etherType := binary.BigEndian.Uint16(frame[12:14])
	switch etherType {
	case etherTypeIPv4, etherTypeIPv6:
	case etherType8021Q, etherType8021AD:
		return oracleVerdict{false, "an in-band VLAN tag"}
	default:
		return oracleVerdict{true, fmt.Sprintf("EtherType %#04x is not IP", etherType)}
	}
	var pkt oraclePacket
	var bad string
	if etherType == etherTypeIPv4 {
		pkt, bad = oracleParseIPv4(frame[14:], direction)
	} else {
		pkt, bad = oracleParseIPv6(frame[14:], direction)
	}
	switch {
	case bad == "neighbour discovery":
		return oracleVerdict{true, bad}
	case bad != "":
		return oracleVerdict{false, bad}
	}
	ident := uint32(testIdentityWorld)
	best := -1
	for _, e := range o.ipcache {
		if e.prefix.Contains(pkt.remote) && e.prefix.Bits() > best {
			best, ident = e.prefix.Bits(), e.identity
		}
	}
	var allowed, denied []string
	for _, r := range o.policy {
		if !oracleMatches(r.key, ident, direction, pkt) {
			continue
		}
		if r.verdict == policy.VerdictDeny {
			denied = append(denied, r.key.String())
		} else {
			allowed = append(allowed, r.key.String())
		}
	}
	what := fmt.Sprintf("%s protocol %d", pkt.remote, pkt.protocol)
	if pkt.hasPort {
		what += fmt.Sprintf(" port %#04x", pkt.port)
	} else {
		what += " without a port"
	}
	what += fmt.Sprintf(", identity %d", ident)
	switch {
	case len(denied) > 0:
		return oracleVerdict{false, what + ": denied by " + strings.Join(denied, ", ")}
	case len(allowed) > 0:
		return oracleVerdict{true, what + ": allowed by " + strings.Join(allowed, ", ")}
	}
	return oracleVerdict{false, what + ": no rule"}
}

// oracleMatches says whether rule key matches pkt from identity in
// direction: a port rule only a packet with a port in its range; a rule
// for a whole protocol every packet of it; an any-protocol rule every
// packet.
func oracleMatches(key policy.Key, ident uint32, direction policy.Direction, pkt oraclePacket) bool {
	if key.Direction != direction || (key.Identity != 0 && uint32(key.Identity) != ident) {
		return false
	}
	if key.Protocol == policy.ProtocolAny {
		return true
	}
	if uint8(key.Protocol) != pkt.protocol {
		return false
	}
	if key.PortWildcardBits >= 16 {
		return true
	}
	if !pkt.hasPort {
		return false
	}
	lo := uint32(key.Port) &^ (1<<key.PortWildcardBits - 1)
	hi := lo + 1<<key.PortWildcardBits - 1
	return uint32(pkt.port) >= lo && uint32(pkt.port) <= hi
}

// oracleL4 sets what policy matches of the transport header l4 of
// protocol: TCP, UDP and SCTP the destination port when the header holds
// both ports; ICMP and ICMPv6 the type and code when it holds its 8
// bytes; anything else no port.
func oracleL4(pkt *oraclePacket, protocol uint8, l4 []byte) {
	pkt.protocol = protocol
	switch protocol {
	case testProtoTCP, testProtoUDP, testProtoSCTP:
		if len(l4) >= 4 {
			pkt.hasPort, pkt.port = true, uint16(l4[2])<<8|uint16(l4[3])
		}
	case testProtoICMP, protoICMPv6:
		if len(l4) >= 8 {
			pkt.hasPort, pkt.port = true, uint16(l4[0])<<8|uint16(l4[1])
		}
	}
}

// oracleParseIPv4 parses ip (what follows the Ethernet header); bad says
// why it cannot pass when it cannot whatever the policy.
func oracleParseIPv4(ip []byte, direction policy.Direction) (oraclePacket, string) {
	var pkt oraclePacket
	if len(ip) < 20 {
		return pkt, "shorter than an IPv4 header"
	}
	version, ihl := ip[0]>>4, int(ip[0]&0x0f)*4
	if version != 4 || ihl < 20 {
		return pkt, fmt.Sprintf("IPv4 version %d, header length %d", version, ihl)
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	pkt.remote = src
	if direction == policy.Egress {
		pkt.remote = dst
	}
	if offset := binary.BigEndian.Uint16(ip[6:8]) & 0x1fff; offset != 0 {
		return pkt, fmt.Sprintf("IPv4 fragment at %d with no first fragment seen", offset*8)
	}
	var l4 []byte
	if ihl <= len(ip) {
		l4 = ip[ihl:]
	}
	oracleL4(&pkt, ip[9], l4)
	return pkt, ""
}

// oracleMaxExtHeaders is how many extension headers the program walks
// (enforce.c's header comment).
const oracleMaxExtHeaders = 8

// oracleParseIPv6 parses ip (what follows the Ethernet header) as
// oracleParseIPv4 does.
func oracleParseIPv6(ip []byte, direction policy.Direction) (oraclePacket, string) {
	var pkt oraclePacket
	if len(ip) < 40 {
		return pkt, "shorter than an IPv6 header"
	}
	if v := ip[0] >> 4; v != 6 {
		return pkt, fmt.Sprintf("IPv6 version %d", v)
	}
	src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	pkt.remote = src
	if direction == policy.Egress {
		pkt.remote = dst
	}
	next, hops := ip[6], ip[7]
	// Neighbour discovery right after the IPv6 header, never routed: to or
	// from an address on the link. A multicast group is on it only of
	// interface or link scope; for any other address the program asks the
	// FIB, which on the loopback of BPF_PROG_RUN always says it is (see
	// FuzzEnforceParser).
	onLink := !pkt.remote.IsMulticast() || pkt.remote.As16()[1]&0x0f <= 2
	if next == protoICMPv6 && hops == 255 && len(ip) > 40 && ip[40] >= 133 && ip[40] <= 137 && onLink {
		return pkt, "neighbour discovery"
	}
	off := 40
	isExt := func(n uint8) bool {
		switch n {
		case protoHopOpts, protoRouting, protoDstOpts, protoFragment, protoAH:
			return true
		}
		return false
	}
	for walked := 0; isExt(next); walked++ {
		if walked == oracleMaxExtHeaders {
			return pkt, "more than 8 extension headers"
		}
		if off+8 > len(ip) {
			return pkt, fmt.Sprintf("extension header %d cut short", next)
		}
		ext := ip[off:]
		switch next {
		case protoFragment:
			fragOffset := binary.BigEndian.Uint16(ext[2:4]) &^ 7
			if fragOffset != 0 {
				return pkt, fmt.Sprintf("IPv6 fragment at %d with no first fragment seen", fragOffset)
			}
			off += 8
		case protoAH:
			off += (int(ext[1]) + 2) * 4
		default:
			off += (int(ext[1]) + 1) * 8
		}
		next = ext[0]
	}
	var l4 []byte
	if off <= len(ip) {
		l4 = ip[off:]
	}
	oracleL4(&pkt, next, l4)
	return pkt, ""
}

// parserFuzzSeeds are valid frames of every kind the program parses,
// each to the fuzz target's remotes.
func parserFuzzSeeds() [][]byte {
	ep4, ep6 := fuzzEndpoint4, fuzzEndpoint6
	a4, b4, c4, w4 := fuzzRemoteA4, fuzzRemoteB4, fuzzRemoteC4, fuzzWorld4
	a6, b6, c6, w6 := fuzzRemoteA6, fuzzRemoteB6, fuzzRemoteC6, fuzzWorld6
	tcp80 := tcpHeader(40000, 80, 0x02)
	udp := udpHeader(40000, 5003, []byte("payload!"))
	seeds := [][]byte{
		frame4(ep4, a4, testProtoTCP, tcp80),
		frame4(a4, ep4, testProtoTCP, tcpHeader(40000, 22, 0x02)),
		frame4(ep4, b4, testProtoUDP, udp),
		frame4(ep4, a4, testProtoUDP, udp),
		frame4(ep4, c4, testProtoTCP, tcpHeader(40000, 23, 0x10)),
		frame4(ep4, c4, protoESP, []byte{0, 0, 0, 1, 0, 0, 0, 1}),
		frame4(ep4, w4, testProtoTCP, tcpHeader(40000, 443, 0x02)),
		frame4(ep4, w4, testProtoSCTP, sctpPacket(netip.AddrPortFrom(ep4, 1), netip.AddrPortFrom(w4, 9000))[34:]),
		frame4(a4, ep4, testProtoICMP, icmpHeader(8, 0, 7, nil)),
		frame4(ep4, a4, testProtoICMP, icmpHeader(3, 4, 0, quote(frame4(a4, ep4, testProtoTCP, tcpHeader(22, 40000, 0x12))))),
		frame4(ep4, a4, testProtoTCP, tcp80[:2]),
		frame4x(ep4, a4, testProtoTCP, []byte{1, 1, 1, 0, 0x94, 4, 0, 0}, 0, 0, tcp80),
		frame4x(ep4, a4, testProtoTCP, nil, 0x2000, 77, tcp80),
		frame4x(ep4, a4, testProtoTCP, nil, 3, 77, tcp80),
		ethFrame(etherTypeARP, make([]byte, 28)),
		vlanFrame(etherType8021Q, 5, frame4(ep4, a4, testProtoTCP, tcp80)),
		vlanFrame(etherType8021AD, 5, vlanFrame(etherType8021Q, 6, frame4(ep4, a4, testProtoTCP, tcp80))),
		frame6(ep6, a6, nil, testProtoTCP, tcp80),
		frame6(ep6, b6, nil, testProtoTCP, tcp80),
		frame6(ep6, c6, nil, protoNoNext, nil),
		frame6(ep6, c6, nil, testProtoTCP, tcpHeader(40000, 23, 0x02)),
		frame6(a6, ep6, nil, protoICMPv6, icmpHeader(128, 0, 9, nil)),
		frame6(ep6, c6, nil, protoICMPv6, icmpHeader(2, 0, 0, quote(frame6(c6, ep6, nil, testProtoUDP, udpHeader(53, 40000, nil))))),
		frame6h(ep6, w6, 255, nil, protoICMPv6, icmpHeader(135, 0, 0, make([]byte, 16))),
		frame6h(ep6, netip.MustParseAddr("fe80::1"), 255, nil, protoICMPv6, icmpHeader(136, 0, 0, make([]byte, 16))),
		frame6h(ep6, w6, 255, []ext6{padExt(protoHopOpts)}, protoICMPv6, icmpHeader(135, 0, 0, make([]byte, 16))),
		frame6(ep6, a6, []ext6{padExt(protoHopOpts), padExt(protoRouting), padExt(protoDstOpts), ahExt()}, testProtoTCP, tcp80),
		frame6(ep6, a6, []ext6{padExt(protoHopOpts), fragExt(0, true, 5)}, testProtoTCP, tcp80),
		frame6(ep6, a6, []ext6{fragExt(0, false, 5)}, testProtoTCP, tcp80),
		frame6(ep6, a6, []ext6{fragExt(8, true, 5)}, testProtoTCP, tcp80),
		frame6(ep6, c6, []ext6{ahExt()}, protoESP, []byte{0, 0, 0, 1}),
	}
	chain := func(n int) []ext6 {
		var exts []ext6
		for i := range n {
			exts = append(exts, padExt([]uint8{protoDstOpts, protoRouting, protoDstOpts}[i%3]))
		}
		return exts
	}
	seeds = append(seeds,
		frame6(ep6, a6, chain(8), testProtoTCP, tcp80),
		frame6(ep6, a6, chain(9), testProtoTCP, tcp80),
		frame6(ep6, c6, chain(9), testProtoUDP, udpHeader(1, 2, nil)),
		vlanFrame(etherType8021Q, 5, frame6(ep6, a6, nil, testProtoTCP, tcp80)),
	)
	return seeds
}
