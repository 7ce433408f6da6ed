// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// One test per parsing rule of enforce.c's header comment ("What is
// parsed, and what is not", and the tracking of ICMP echo and errors),
// each with crafted frames run by BPF_PROG_RUN on the loopback (ifindex
// 1), asserting the verdict and the counter slot it went to.

// ruleHarness is the program with its own maps, both directions enforced
// with default deny unless a test changes it.
type ruleHarness struct {
	t    *testing.T
	maps enforcerMaps
	enf  *enforcer
}

// The addresses of the rule tests: the endpoint's, a remote of identity
// A, one of identity B, and a remote in no ipcache entry (world).
var (
	ruleEP4     = netip.MustParseAddr("10.0.0.1")
	ruleA4      = netip.MustParseAddr("10.1.0.5")
	ruleB4      = netip.MustParseAddr("10.2.0.5")
	ruleRouter4 = netip.MustParseAddr("198.51.100.1")
	ruleEP6     = netip.MustParseAddr("fd00::1")
	ruleA6      = netip.MustParseAddr("fd00:1::5")
	ruleRouter6 = netip.MustParseAddr("2001:db8::1")
)

func newRuleHarness(t *testing.T) *ruleHarness {
	t.Helper()
	privileged.Test(t)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, "10.1.0.0/16", testIdentityAllowed)
	putIdentity(t, maps, "10.2.0.0/16", testIdentityDenied)
	putIdentity(t, maps, "fd00:1::/64", testIdentityAllowed)
	putEnforced(t, maps, policy.Ingress, true)
	putEnforced(t, maps, policy.Egress, true)
	return &ruleHarness{t: t, maps: maps, enf: loadTestEnforcer(t, maps)}
}

// slots reads every counters slot, summed over CPUs.
func (h *ruleHarness) slots() [countersEntries]uint64 {
	h.t.Helper()
	var s [countersEntries]uint64
	for i := range uint32(countersEntries) {
		var perCPU []counterValue
		require.NoError(h.t, h.maps.Counters.Lookup(i, &perCPU))
		for _, v := range perCPU {
			s[i] += v.Packets
		}
	}
	return s
}

// uncounted is the slot of expect for a packet the program does not count.
const uncounted = -1

// expect runs frame through the entry point of direction and requires the
// verdict want (tcxNextRet or tcxDropRet) and one packet more in the
// direction's slot (countAllowed or a drop reason), or none anywhere.
func (h *ruleHarness) expect(direction policy.Direction, frame []byte, want uint32, slot int, msg string) {
	h.t.Helper()
	prog := h.enf.toEndpoint
	if direction == policy.Egress {
		prog = h.enf.fromEndpoint
	}
	before := h.slots()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	require.NoError(h.t, err, msg)
	after := h.slots()
	require.Equal(h.t, want, ret, "%s: verdict", msg)
	var wantSlots [countersEntries]uint64
	copy(wantSlots[:], before[:])
	if slot != uncounted {
		wantSlots[counterIndex(direction, uint32(slot))]++
	}
	require.Equal(h.t, wantSlots, after, "%s: counters (index direction*8 + slot, want slot %d of %s)", msg, slot, direction)
}

func (h *ruleHarness) allow(identity uint32, direction policy.Direction, protocol uint8, port uint16) {
	h.t.Helper()
	putAllow(h.t, h.maps, identity, direction, protocol, port)
}

// tracked says whether conntrack has an entry of the endpoint and remote.
func (h *ruleHarness) tracked(endpoint, remote netip.AddrPort, protocol uint8) (bpfmaps.ConntrackValue, bool) {
	h.t.Helper()
	var v bpfmaps.ConntrackValue
	err := lookupConntrack(h.maps, bpfmaps.NewConntrackKey(progRunIfindex, endpoint, remote, protocol), &v)
	if err != nil {
		require.ErrorIs(h.t, err, ebpf.ErrKeyNotExist)
		return v, false
	}
	return v, true
}

const (
	dirIn  = policy.Ingress
	dirOut = policy.Egress
)

// A frame with an in-band 802.1Q or 802.1ad tag (the kernel moved any
// outer one to metadata) is dropped in an enforced direction, whatever it
// holds, and passes in one that is not.
func TestPrivilegedParseRuleInBandVLANTagDroppedWhenEnforced(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 80)
	h.allow(testIdentityAllowed, dirIn, testProtoTCP, 0)
	inner := frame4(ruleEP4, ruleA4, testProtoTCP, tcpHeader(40000, 80, 0x02))
	h.expect(dirOut, inner, tcxNextRet, countAllowed, "the untagged frame")
	for _, tpid := range []uint16{etherType8021Q, etherType8021AD} {
		tagged := vlanFrame(tpid, 7, inner)
		h.expect(dirOut, tagged, tcxDropRet, int(bpfmaps.ReasonVLANTagged), fmt.Sprintf("tag %#x, egress enforced", tpid))
		h.expect(dirIn, vlanFrame(tpid, 7, frame4(ruleA4, ruleEP4, testProtoTCP, tcpHeader(80, 40000, 0x12))),
			tcxDropRet, int(bpfmaps.ReasonVLANTagged), fmt.Sprintf("tag %#x, ingress enforced", tpid))
	}
	putEnforced(t, h.maps, dirOut, false)
	for _, tpid := range []uint16{etherType8021Q, etherType8021AD} {
		h.expect(dirOut, vlanFrame(tpid, 7, inner), tcxNextRet, countAllowed, fmt.Sprintf("tag %#x, egress not enforced", tpid))
	}
}

// Non-IP traffic (ARP) passes in an enforced direction and is not
// counted.
func TestPrivilegedParseRuleNonIPPassesUncounted(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	arp := ethFrame(etherTypeARP, make([]byte, 28))
	h.expect(dirOut, arp, tcxNextRet, uncounted, "ARP from the endpoint")
	h.expect(dirIn, arp, tcxNextRet, uncounted, "ARP to the endpoint")
	h.expect(dirOut, ethFrame(0x88cc, make([]byte, 40)), tcxNextRet, uncounted, "LLDP")
}

// An IPv4 or IPv6 packet too short for its fixed header, or of another
// version, or IPv4 with a header length under 20, is dropped as malformed
// in an enforced direction and passes in one that is not.
func TestPrivilegedParseRuleShortOrWrongVersionIPHeaderMalformed(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(0, dirOut, 0, 0) // any identity, any protocol: policy would pass all
	good4 := frame4(ruleEP4, ruleA4, testProtoUDP, udpHeader(1, 2, nil))
	good6 := frame6(ruleEP6, ruleA6, nil, testProtoUDP, udpHeader(1, 2, nil))
	h.expect(dirOut, good4, tcxNextRet, countAllowed, "a whole IPv4 packet")
	h.expect(dirOut, good6, tcxNextRet, countAllowed, "a whole IPv6 packet")

	wrongVersion4 := append([]byte(nil), good4...)
	wrongVersion4[14] = 0x65
	shortIHL := append([]byte(nil), good4...)
	shortIHL[14] = 0x44
	wrongVersion6 := append([]byte(nil), good6...)
	wrongVersion6[14] = 0x40
	for name, frame := range map[string][]byte{
		"IPv4 of version 6":     wrongVersion4,
		"IPv4 header length 16": shortIHL,
		"IPv6 of version 4":     wrongVersion6,
	} {
		h.expect(dirOut, frame, tcxDropRet, int(bpfmaps.ReasonMalformed), name+", enforced")
	}
	// Linux 6.x's BPF_PROG_RUN refuses (EINVAL) a frame of an IP
	// EtherType shorter than the fixed IP header, before the program
	// runs: where it does, that part of the rule is not tested here.
	short := map[string][]byte{
		"IPv4 cut at 19 bytes":   good4[:14+19],
		"IPv6 cut at 39 bytes":   good6[:14+39],
		"EtherType IPv4, 1 byte": ethFrame(etherTypeIPv4, []byte{0x45}),
	}
	for name, frame := range short {
		if _, err := h.enf.fromEndpoint.Run(&ebpf.RunOptions{Data: frame}); errors.Is(err, unix.EINVAL) {
			t.Logf("%s: BPF_PROG_RUN refuses it on this kernel, not tested", name)
			continue
		}
		h.expect(dirOut, frame, tcxDropRet, int(bpfmaps.ReasonMalformed), name+", enforced")
	}
	putEnforced(t, h.maps, dirOut, false)
	h.expect(dirOut, wrongVersion4, tcxNextRet, countAllowed, "IPv4 of version 6, not enforced")
	h.expect(dirOut, wrongVersion6, tcxNextRet, countAllowed, "IPv6 of version 4, not enforced")
}

// IPv4 options (header length over 20) are skipped: the ports are read
// after them.
func TestPrivilegedParseRuleIPv4OptionsPortsReadAfterThem(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 80)
	// Two NOPs and the end of the option list, then padding: bytes 2-3
	// read as port 80 if the options were taken for TCP.
	options := []byte{1, 1, 0x00, 0x50, 1, 1, 1, 0}
	h.expect(dirOut, frame4x(ruleEP4, ruleA4, testProtoTCP, options, 0, 0, tcpHeader(40000, 80, 0x02)),
		tcxNextRet, countAllowed, "TCP 80 after 8 bytes of options")
	h.expect(dirOut, frame4x(ruleEP4, ruleA4, testProtoTCP, options, 0, 0, tcpHeader(0, 81, 0x02)),
		tcxDropRet, int(bpfmaps.ReasonNoPolicy), "TCP 81 after options that look like port 80")
	// The longest header: 40 bytes of options.
	long := make([]byte, 40)
	for i := range long {
		long[i] = 1
	}
	h.expect(dirOut, frame4x(ruleEP4, ruleA4, testProtoTCP, long, 0, 0, tcpHeader(40000, 80, 0x02)),
		tcxNextRet, countAllowed, "TCP 80 after 40 bytes of options")
}

// IPv6 extension headers (hop-by-hop, routing, destination options, AH,
// fragment) are walked, up to 8: the protocol and port after them are
// matched.
func TestPrivilegedParseRuleIPv6UpToEightExtensionHeadersWalked(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 80)
	kinds := []ext6{padExt(protoHopOpts), padExt(protoRouting), padExt(protoDstOpts), ahExt(), fragExt(0, false, 9)}
	for n := 1; n <= 8; n++ {
		var exts []ext6
		for i := range n {
			exts = append(exts, kinds[i%len(kinds)])
		}
		// A routing header of 24 bytes somewhere in the chain, so that
		// a length other than 8 is walked too.
		if n >= 3 {
			exts[1] = ext6{kind: protoRouting, body: make([]byte, 22)}
		}
		h.expect(dirOut, frame6(ruleEP6, ruleA6, exts, testProtoTCP, tcpHeader(40000, 80, 0x02)),
			tcxNextRet, countAllowed, fmt.Sprintf("TCP 80 behind %d extension headers", n))
		h.expect(dirOut, frame6(ruleEP6, ruleA6, exts, testProtoTCP, tcpHeader(40000, 81, 0x02)),
			tcxDropRet, int(bpfmaps.ReasonNoPolicy), fmt.Sprintf("TCP 81 behind %d extension headers", n))
		h.expect(dirOut, frame6(ruleEP6, ruleA6, exts, testProtoUDP, udpHeader(40000, 80, nil)),
			tcxDropRet, int(bpfmaps.ReasonNoPolicy), fmt.Sprintf("UDP 80 behind %d extension headers", n))
	}
}

// A ninth extension header drops the packet (ext-headers), whatever the
// policy: even an any-protocol allow of its remote.
func TestPrivilegedParseRuleIPv6NineExtensionHeadersDropped(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, 0, 0)
	h.allow(0, dirOut, 0, 0)
	var exts []ext6
	for i := range 9 {
		exts = append(exts, padExt([]uint8{protoDstOpts, protoRouting, protoHopOpts}[i%3]))
	}
	h.expect(dirOut, frame6(ruleEP6, ruleA6, exts[:8], testProtoTCP, tcpHeader(40000, 80, 0x02)),
		tcxNextRet, countAllowed, "8 extension headers")
	h.expect(dirOut, frame6(ruleEP6, ruleA6, exts, testProtoTCP, tcpHeader(40000, 80, 0x02)),
		tcxDropRet, int(bpfmaps.ReasonExtHeaders), "9 extension headers")
	exts[8] = ahExt()
	h.expect(dirOut, frame6(ruleEP6, ruleA6, exts, protoNoNext, nil),
		tcxDropRet, int(bpfmaps.ReasonExtHeaders), "9 extension headers, the last AH")
}

// ESP and "no next header", which the program does not walk past, are
// matched as that protocol without a port: a rule for the whole protocol
// passes them, one with a port does not.
func TestPrivilegedParseRuleESPAndNoNextHeaderMatchedWithoutPort(t *testing.T) {
	t.Parallel()
	for _, protocol := range []uint8{protoESP, protoNoNext} {
		t.Run(fmt.Sprintf("protocol %d", protocol), func(t *testing.T) {
			h := newRuleHarness(t)
			// An ESP header whose first bytes (the SPI) read as port 80.
			esp := []byte{0, 0, 0, 80, 0, 0, 0, 1}
			frames := map[string][]byte{
				"IPv6":           frame6(ruleEP6, ruleA6, nil, protocol, esp),
				"IPv6 behind AH": frame6(ruleEP6, ruleA6, []ext6{padExt(protoHopOpts), ahExt()}, protocol, esp),
			}
			if protocol == protoESP {
				frames["IPv4"] = frame4(ruleEP4, ruleA4, protocol, esp)
			}
			h.allow(testIdentityAllowed, dirOut, protocol, 80)
			h.allow(testIdentityAllowed, dirOut, testProtoTCP, 0) // another protocol
			for name, frame := range frames {
				h.expect(dirOut, frame, tcxDropRet, int(bpfmaps.ReasonNoPolicy), name+", a port rule of the protocol")
			}
			h.allow(testIdentityAllowed, dirOut, protocol, 0)
			for name, frame := range frames {
				h.expect(dirOut, frame, tcxNextRet, countAllowed, name+", a rule of the whole protocol")
			}
			require.Empty(t, conntrackEntries(t, h.maps), "not tracked")
		})
	}
}

// A TCP or UDP header too short for the ports is matched without a port
// and not tracked. A TCP header with the ports but too short for the
// flags (4 to 13 bytes) is matched with its port, and not tracked.
func TestPrivilegedParseRuleShortTransportHeaderMatchedWithoutPort(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 80)
	h.allow(testIdentityAllowed, dirOut, testProtoUDP, 80)
	tcp, udp := tcpHeader(40000, 80, 0x02), udpHeader(40000, 80, nil)
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoTCP, tcp[:3]), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "TCP of 3 bytes, a port rule")
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoUDP, udp[:3]), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "UDP of 3 bytes, a port rule")
	h.expect(dirOut, frame6(ruleEP6, ruleA6, nil, testProtoTCP, tcp[:2]), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "IPv6 TCP of 2 bytes, a port rule")
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoTCP, tcp[:13]), tcxNextRet, countAllowed, "TCP of 13 bytes (no flags), a port rule")
	require.Empty(t, conntrackEntries(t, h.maps), "TCP without flags is not tracked")
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoUDP, udp[:4]), tcxNextRet, countAllowed, "UDP of 4 bytes, a port rule")
	_, ok := h.tracked(netip.AddrPortFrom(ruleEP4, 40000), netip.AddrPortFrom(ruleA4, 80), testProtoUDP)
	require.True(t, ok, "UDP with its ports is tracked")

	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 0)
	h.allow(testIdentityAllowed, dirOut, testProtoUDP, 0)
	require.NoError(t, h.maps.ConntrackOpening.Delete(bpfmaps.NewConntrackKey(progRunIfindex, netip.AddrPortFrom(ruleEP4, 40000), netip.AddrPortFrom(ruleA4, 80), testProtoUDP)))
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoTCP, tcp[:3]), tcxNextRet, countAllowed, "TCP of 3 bytes, a rule of the whole protocol")
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoUDP, udp[:3]), tcxNextRet, countAllowed, "UDP of 3 bytes, a rule of the whole protocol")
	require.Empty(t, conntrackEntries(t, h.maps), "short headers are not tracked")
}

// ICMP echo is tracked by its identifier: the reply with the request's
// identifier passes as a reply, another identifier does not. An echo too
// short for its identifier is matched without a type and not tracked.
func TestPrivilegedParseRuleICMPEchoTrackedByIdentifier(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoICMP, 8<<8)
	h.allow(testIdentityAllowed, dirOut, protoICMPv6, 128<<8)
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoICMP, icmpHeader(8, 0, 7, nil)), tcxNextRet, countAllowed, "echo request")
	_, ok := h.tracked(netip.AddrPortFrom(ruleEP4, 7), netip.AddrPortFrom(ruleA4, 0), testProtoICMP)
	require.True(t, ok, "the echo is tracked by its identifier")
	h.expect(dirIn, frame4(ruleA4, ruleEP4, testProtoICMP, icmpHeader(0, 0, 7, nil)), tcxNextRet, countAllowed, "echo reply, same identifier")
	h.expect(dirIn, frame4(ruleA4, ruleEP4, testProtoICMP, icmpHeader(0, 0, 8, nil)), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "echo reply, another identifier")
	h.expect(dirIn, frame4(ruleA4, ruleEP4, testProtoICMP, icmpHeader(8, 0, 7, nil)), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "an echo request the other way is no reply")

	h.expect(dirOut, frame6(ruleEP6, ruleA6, nil, protoICMPv6, icmpHeader(128, 0, 9, nil)), tcxNextRet, countAllowed, "ICMPv6 echo request")
	h.expect(dirIn, frame6(ruleA6, ruleEP6, nil, protoICMPv6, icmpHeader(129, 0, 9, nil)), tcxNextRet, countAllowed, "ICMPv6 echo reply, same identifier")
	h.expect(dirIn, frame6(ruleA6, ruleEP6, nil, protoICMPv6, icmpHeader(129, 0, 10, nil)), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "ICMPv6 echo reply, another identifier")

	entries := len(conntrackEntries(t, h.maps))
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoICMP, icmpHeader(8, 0, 11, nil)[:6]), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "an echo of 6 bytes, a type rule")
	h.allow(testIdentityAllowed, dirOut, testProtoICMP, 0)
	h.expect(dirOut, frame4(ruleEP4, ruleA4, testProtoICMP, icmpHeader(8, 0, 11, nil)[:6]), tcxNextRet, countAllowed, "an echo of 6 bytes, a rule of the whole protocol")
	require.Len(t, conntrackEntries(t, h.maps), entries, "a short echo is not tracked")
}

// An ICMP error quoting a tracked connection's packet passes (related)
// only when it is consistent with it: it goes to the quoted packet's
// source, and one the endpoint sends comes from the quoted packet's
// destination. Deny rules of its own remote still drop it.
func TestPrivilegedParseRuleICMPErrorRelatedOnlyWhenConsistent(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 80)
	h.allow(testIdentityAllowed, dirIn, testProtoTCP, 22)
	epOut := netip.AddrPortFrom(ruleEP4, 40000)
	peer := netip.AddrPortFrom(ruleA4, 80)
	sent := frame4(epOut.Addr(), peer.Addr(), testProtoTCP, tcpHeader(epOut.Port(), peer.Port(), 0x02))
	h.expect(dirOut, sent, tcxNextRet, countAllowed, "the endpoint opens TCP 80")
	unreach := func(src, dst netip.Addr, quoted []byte) []byte {
		return frame4(src, dst, testProtoICMP, icmpHeader(3, 1, 0, quote(quoted)))
	}
	// Errors to the endpoint, about what it sent: from a router (world)
	// or the peer.
	h.expect(dirIn, unreach(ruleRouter4, ruleEP4, sent), tcxNextRet, countAllowed, "from a router, to the quoted source")
	h.expect(dirIn, unreach(ruleA4, ruleEP4, sent), tcxNextRet, countAllowed, "from the peer, to the quoted source")
	h.expect(dirIn, unreach(ruleRouter4, netip.MustParseAddr("10.0.0.2"), sent), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "to another address than the quoted source")
	other := frame4(epOut.Addr(), peer.Addr(), testProtoTCP, tcpHeader(epOut.Port()+1, peer.Port(), 0x02))
	h.expect(dirIn, unreach(ruleRouter4, ruleEP4, other), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "quoting a connection not tracked")

	// Errors the endpoint sends about what it received.
	client := netip.AddrPortFrom(ruleA4, 5555)
	received := frame4(client.Addr(), ruleEP4, testProtoTCP, tcpHeader(client.Port(), 22, 0x02))
	h.expect(dirIn, received, tcxNextRet, countAllowed, "the peer opens TCP 22")
	h.expect(dirOut, unreach(ruleEP4, ruleA4, received), tcxNextRet, countAllowed, "from the quoted destination to the quoted source")
	h.expect(dirOut, unreach(netip.MustParseAddr("10.0.0.2"), ruleA4, received), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "from another address than the quoted destination")
	h.expect(dirOut, unreach(ruleEP4, netip.MustParseAddr("10.1.0.6"), received), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "to another address than the quoted source")

	// A deny of the error's remote drops it.
	putPolicy(t, h.maps, policy.Key{Identity: testIdentityDenied, Direction: dirIn, Protocol: policy.ProtocolAny}, policy.VerdictDeny)
	h.expect(dirIn, unreach(ruleB4, ruleEP4, sent), tcxDropRet, int(bpfmaps.ReasonPolicyDeny), "from a denied remote, quoting a tracked connection")
	h.expect(dirIn, unreach(ruleRouter4, ruleEP4, sent), tcxNextRet, countAllowed, "still from a router")

	// IPv6: packet too big about a tracked connection.
	ep6 := netip.AddrPortFrom(ruleEP6, 40001)
	sent6 := frame6(ep6.Addr(), ruleA6, nil, testProtoTCP, tcpHeader(ep6.Port(), 80, 0x02))
	h.expect(dirOut, sent6, tcxNextRet, countAllowed, "the endpoint opens TCP 80 over IPv6")
	tooBig := func(src, dst netip.Addr, quoted []byte) []byte {
		return frame6(src, dst, nil, protoICMPv6, icmpHeader(2, 0, 0, quote(quoted)))
	}
	h.expect(dirIn, tooBig(ruleRouter6, ruleEP6, sent6), tcxNextRet, countAllowed, "packet too big to the quoted source")
	h.expect(dirIn, tooBig(ruleRouter6, netip.MustParseAddr("fd00::2"), sent6), tcxDropRet, int(bpfmaps.ReasonNoPolicy), "packet too big to another address")
}

// A connection whose forward packet policy drops is revoked: its packets
// the other way are no longer replies, and policy decides on them.
func TestPrivilegedParseRuleRevokedEntryReversePacketsAreNoReplies(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	h.allow(testIdentityAllowed, dirOut, testProtoTCP, 80)
	epOut, peer := netip.AddrPortFrom(ruleEP4, 40000), netip.AddrPortFrom(ruleA4, 80)
	forward := frame4(epOut.Addr(), peer.Addr(), testProtoTCP, tcpHeader(epOut.Port(), peer.Port(), 0x10))
	reverse := frame4(peer.Addr(), epOut.Addr(), testProtoTCP, tcpHeader(peer.Port(), epOut.Port(), 0x10))
	h.expect(dirOut, forward, tcxNextRet, countAllowed, "forward, allowed")
	h.expect(dirIn, reverse, tcxNextRet, countAllowed, "reverse, a reply")

	clearPolicyMap(t, h.maps)
	h.expect(dirOut, forward, tcxDropRet, int(bpfmaps.ReasonNoPolicy), "forward, its allow gone")
	v, ok := h.tracked(epOut, peer, testProtoTCP)
	require.True(t, ok, "the revoked entry is kept")
	require.NotZero(t, v.Flags()&bpfmaps.ConntrackRevoked, "revoked")
	h.expect(dirIn, reverse, tcxDropRet, int(bpfmaps.ReasonNoPolicy), "reverse of a revoked entry: no reply")
	// An allow of the reverse direction decides on it now.
	h.allow(testIdentityAllowed, dirIn, testProtoTCP, 40000)
	h.expect(dirIn, reverse, tcxNextRet, countAllowed, "reverse of a revoked entry, allowed by policy")
}

// IPv6 neighbour discovery (ICMPv6 133-137, hop limit 255, right after the
// IPv6 header) on the link passes, counted as allowed; with another hop
// limit or behind an extension header policy decides. Whether the remote
// is on the link is the FIB's answer for the device: on the loopback of
// BPF_PROG_RUN, with forwarding off (the default), every remote is.
func TestPrivilegedParseRuleNeighbourDiscoveryOnLinkPasses(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	ns := make([]byte, 16)
	for typ := uint8(133); typ <= 137; typ++ {
		h.expect(dirOut, frame6h(ruleEP6, netip.MustParseAddr("fe80::1"), 255, nil, protoICMPv6, icmpHeader(typ, 0, 0, ns)),
			tcxNextRet, countAllowed, fmt.Sprintf("type %d to a link-local address", typ))
		h.expect(dirIn, frame6h(netip.MustParseAddr("::"), ruleEP6, 255, nil, protoICMPv6, icmpHeader(typ, 0, 0, ns)),
			tcxNextRet, countAllowed, fmt.Sprintf("type %d from the unspecified address", typ))
	}
	h.expect(dirOut, frame6h(ruleEP6, netip.MustParseAddr("fe80::1"), 64, nil, protoICMPv6, icmpHeader(135, 0, 0, ns)),
		tcxDropRet, int(bpfmaps.ReasonNoPolicy), "hop limit 64")
	h.expect(dirOut, frame6h(ruleEP6, netip.MustParseAddr("fe80::1"), 255, []ext6{padExt(protoHopOpts)}, protoICMPv6, icmpHeader(135, 0, 0, ns)),
		tcxDropRet, int(bpfmaps.ReasonNoPolicy), "behind a hop-by-hop header")
	h.expect(dirOut, frame6h(ruleEP6, netip.MustParseAddr("fe80::1"), 255, nil, protoICMPv6, icmpHeader(138, 0, 0, ns)),
		tcxDropRet, int(bpfmaps.ReasonNoPolicy), "type 138")
}

// Neighbour discovery to a remote the host forwards to is not on the
// link: policy decides. BPF_PROG_RUN runs on the loopback of the calling
// thread's namespace, so the test runs it in a namespace of its own with
// forwarding on and a route to the remote.
func TestPrivilegedParseRuleNeighbourDiscoveryForwardedDecidedByPolicy(t *testing.T) {
	t.Parallel()
	h := newRuleHarness(t)
	ns := fmt.Sprintf("ipca-ndp-%d-%d", os.Getpid(), netnsSeq.Add(1))
	ipCmd(t, "netns", "add", ns)
	t.Cleanup(func() {
		if dirOut, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, dirOut)
		}
	})
	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	ipCmd(t, "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	ipCmd(t, "-n", ns, "link", "set", "v0", "up")
	ipCmd(t, "-n", ns, "link", "set", "v1", "up")
	ipCmd(t, "-n", ns, "-6", "route", "add", "2001:db8:77::/48", "dev", "v0")
	ipCmd(t, "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")

	solicit := frame6h(ruleEP6, netip.MustParseAddr("2001:db8:77::1"), 255, nil, protoICMPv6, icmpHeader(135, 0, 0, make([]byte, 16)))
	linkLocal := frame6h(ruleEP6, netip.MustParseAddr("fe80::1"), 255, nil, protoICMPv6, icmpHeader(135, 0, 0, make([]byte, 16)))
	var routed, local uint32
	require.NoError(t, inNetns(t, ns, func() error {
		var err error
		if routed, err = h.enf.fromEndpoint.Run(&ebpf.RunOptions{Data: solicit}); err != nil {
			return err
		}
		local, err = h.enf.fromEndpoint.Run(&ebpf.RunOptions{Data: linkLocal})
		return err
	}))
	require.Equal(t, uint32(tcxDropRet), routed, "a solicitation to a routed remote, no policy")
	require.Equal(t, uint32(tcxNextRet), local, "a solicitation to a link-local remote")
}
