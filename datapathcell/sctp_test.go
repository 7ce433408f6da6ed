// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

const (
	testProtoICMP = 1
	testProtoSCTP = 132
)

// ipv4Packet is an Ethernet and IPv4 header from src to dst carrying l4.
func ipv4Packet(src, dst netip.Addr, protocol uint8, l4 []byte) []byte {
	p := make([]byte, 14+20, 14+20+len(l4))
	binary.BigEndian.PutUint16(p[12:14], 0x0800)
	ip := p[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(l4)))
	ip[8] = 64
	ip[9] = protocol
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	return append(p, l4...)
}

// sctpPacket is an SCTP packet from src to dst: the common header
// (ports, verification tag, checksum) and one empty DATA chunk header.
func sctpPacket(src, dst netip.AddrPort) []byte {
	sctp := make([]byte, 12+4)
	binary.BigEndian.PutUint16(sctp[0:2], src.Port())
	binary.BigEndian.PutUint16(sctp[2:4], dst.Port())
	binary.BigEndian.PutUint32(sctp[4:8], 0x01020304)
	binary.BigEndian.PutUint16(sctp[14:16], 4) // chunk length
	return ipv4Packet(src.Addr(), dst.Addr(), testProtoSCTP, sctp)
}

// The program reads SCTP's destination port for policy and tracks SCTP
// associations by their ports, as it does UDP: an allowed port passes,
// another is dropped, the replies of an allowed association pass in an
// enforced direction without a rule of their own, and so do ICMP errors
// quoting its packets. A header too short for the ports is matched with
// no port.
func TestPrivilegedSCTPPortsAndTracking(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	const allowedPort, otherPort = 9899, 9900
	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	allowed := netip.AddrPortFrom(benchPeer, allowedPort)
	other := netip.AddrPortFrom(benchPeer, otherPort)
	putIdentity(t, maps, benchPeer.String()+"/32", testIdentityAllowed)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoSCTP, allowedPort)
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)

	run := func(prog *ebpf.Program, pkt []byte, want uint32, msg string) {
		t.Helper()
		ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
		require.NoError(t, err)
		require.Equal(t, want, ret, msg)
	}
	tracked := func(remote netip.AddrPort) bool {
		t.Helper()
		var v bpfmaps.ConntrackValue
		err := lookupConntrack(maps, bpfmaps.NewConntrackKey(progRunIfindex, out, remote, testProtoSCTP), &v)
		if err != nil {
			require.ErrorIs(t, err, ebpf.ErrKeyNotExist)
			return false
		}
		return true
	}

	// Before the association is opened, its replies have no rule.
	run(enf.toEndpoint, sctpPacket(allowed, out), tcxDropRet, "a reply before the association is opened")

	run(enf.fromEndpoint, sctpPacket(out, allowed), tcxNextRet, "SCTP to the allowed port")
	require.True(t, tracked(allowed), "the allowed association is tracked")
	run(enf.toEndpoint, sctpPacket(allowed, out), tcxNextRet, "the reply of the allowed association")
	entries := conntrackEntries(t, maps)
	require.Len(t, entries, 1)
	for k, v := range entries {
		_, _, protocol, err := k.Fields()
		require.NoError(t, err)
		require.Equal(t, "SCTP", policy.Protocol(protocol).PacketString())
		require.Equal(t, uint8(bpfmaps.ConntrackReplySeen), v.Flags(), "no TCP state, a reply seen")
	}

	// An ICMP error quoting the association's packet passes as the
	// association's; one quoting another association's does not.
	icmpError := func(quoted []byte) []byte {
		icmp := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quoted[14:14+20+8]...) // port unreachable
		return ipv4Packet(benchPeer, benchEndpoint, testProtoICMP, icmp)
	}
	run(enf.toEndpoint, icmpError(sctpPacket(out, allowed)), tcxNextRet, "an ICMP error quoting the allowed association")
	run(enf.toEndpoint, icmpError(sctpPacket(out, other)), tcxDropRet, "an ICMP error quoting another association")

	run(enf.fromEndpoint, sctpPacket(out, other), tcxDropRet, "SCTP to another port")
	require.False(t, tracked(other), "a dropped association is not tracked")
	run(enf.toEndpoint, sctpPacket(other, out), tcxDropRet, "a packet from the port that was dropped")

	// Two bytes of SCTP: the source port only. Matched with no port, so
	// the port's rule does not pass it; a rule for the whole protocol
	// does, and it is not tracked.
	short := ipv4Packet(benchEndpoint, benchPeer, testProtoSCTP, []byte{0x9c, 0x40})
	run(enf.fromEndpoint, short, tcxDropRet, "a short SCTP header with only a port rule")
	putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoSCTP, 0)
	run(enf.fromEndpoint, short, tcxNextRet, "a short SCTP header with a rule for the whole protocol")
	require.Len(t, conntrackEntries(t, maps), 1, "the short packet is not tracked")
}
