// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// runVerdict runs one frame through prog and returns its verdict.
func runVerdict(t *testing.T, prog *ebpf.Program, frame []byte) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	require.NoError(t, err)
	return ret
}

// handshake runs a TCP handshake the peer opens toward the endpoint
// (SYN in, SYN-ACK out, ACK in) and one segment of data each way.
func handshake(t *testing.T, enf *enforcer, peer, endpoint netip.AddrPort) {
	t.Helper()
	const syn, ack, synAck = 0x02, 0x10, 0x12
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.toEndpoint, tcpPacket(peer, endpoint, syn)), "SYN")
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, tcpPacket(endpoint, peer, synAck)), "SYN-ACK")
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.toEndpoint, tcpPacket(peer, endpoint, ack)), "ACK")
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, tcpPacket(endpoint, peer, ack)), "data out")
}

// A SYN flood to an allowed inbound port, from sources inside the allowed
// CIDR, fills ct_opening many times over; the established connection is
// in conntrack, which the flood never touches, and its packets keep
// passing both ways.
func TestPrivilegedEstablishedConnectionSurvivesSYNFlood(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	allowInboundPort80(t, maps)

	endpoint := netip.MustParseAddrPort("10.0.0.1:80")
	peer := netip.MustParseAddrPort("192.0.2.10:40000")
	handshake(t, enf, peer, endpoint)
	key := bpfmaps.NewConntrackKey(progRunIfindex, endpoint, peer, testProtoTCP)
	var v bpfmaps.ConntrackValue
	require.NoError(t, maps.Conntrack.Lookup(key, &v), "established: moved to conntrack")

	flood := int(maps.ConntrackOpening.MaxEntries()) * 4
	for i := range flood {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i%250)}), uint16(1024+i/250))
		require.EqualValues(t, tcxNextRet, runVerdict(t, enf.toEndpoint, tcpPacket(src, endpoint, 0x02)), "SYN %d", i)
	}
	require.LessOrEqual(t, len(conntrackMapEntries(t, maps.ConntrackOpening)), int(maps.ConntrackOpening.MaxEntries()))
	require.Len(t, conntrackMapEntries(t, maps.Conntrack), 1, "the flood reached conntrack")
	require.NoError(t, maps.Conntrack.Lookup(key, &v), "the flood evicted the established connection")
	// Its packets still pass both ways: the endpoint's (egress allows
	// nothing) only as replies.
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, tcpPacket(endpoint, peer, 0x10)), "reply after the flood")
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.toEndpoint, tcpPacket(peer, endpoint, 0x10)), "data in after the flood")
	full, err := enf.conntrackFull()
	require.NoError(t, err)
	require.Zero(t, full)
}

// A full conntrack map keeps what it holds: a connection that becomes
// established then stays in ct_opening (it still works), and the program
// counts it.
func TestPrivilegedConntrackFullIsCounted(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := newTestEnforcerMaps(t)
	small, err := ebpf.NewMap(bpfmaps.ConntrackSpec(4))
	require.NoError(t, err)
	t.Cleanup(func() { small.Close() })
	maps.Conntrack = small
	enf := loadTestEnforcer(t, maps)
	allowInboundPort80(t, maps)

	endpoint := netip.MustParseAddrPort("10.0.0.1:80")
	for i := range 6 {
		handshake(t, enf, netip.AddrPortFrom(netip.MustParseAddr("192.0.2.10"), uint16(40000+i)), endpoint)
	}
	require.Len(t, conntrackMapEntries(t, small), 4)
	require.Len(t, conntrackMapEntries(t, maps.ConntrackOpening), 2, "the two that did not fit")
	full, err := enf.conntrackFull()
	require.NoError(t, err)
	// Each of the two tried once, at its handshake's ACK (the data out is
	// a reply, which moves nothing); each further packet of theirs from
	// the peer tries again.
	require.EqualValues(t, 2, full)
	last := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.10"), 40005)
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.toEndpoint, tcpPacket(last, endpoint, 0x10)), "data in")
	full, err = enf.conntrackFull()
	require.NoError(t, err)
	require.EqualValues(t, 3, full)
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, tcpPacket(endpoint, last, 0x10)), "a reply of a connection left in ct_opening")
}

// allowInboundPort80 enforces both directions and allows TCP 80 in from
// 192.0.2.0/24 only: the endpoint's packets then pass only as replies.
func allowInboundPort80(t *testing.T, maps enforcerMaps) {
	t.Helper()
	putIdentity(t, maps, "192.0.2.0/24", testIdentityAllowed)
	putAllow(t, maps, testIdentityAllowed, policy.Ingress, testProtoTCP, 80)
	putEnforced(t, maps, policy.Ingress, true)
	putEnforced(t, maps, policy.Egress, true)
	bumpRevision(t, maps)
}
