// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The program counts bytes (skb->len) with packets, and each drop under its
// reason: a policy drop and a packet too short for its IP header land in
// different slots.
func TestPrivilegedCountersBytesAndDropReasons(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := benchMaps(t)
	setEnforced(t, maps, true, true)
	enf, err := loadEnforcer(maps)
	require.NoError(t, err)
	t.Cleanup(func() { enf.Close() })

	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	allowed := tcpPacket(out, peer, 0x02) // egress, allowed by policy
	// Ingress from another port of the peer: no reply of the allowed
	// connection, and no ingress policy.
	denied := tcpPacket(netip.AddrPortFrom(benchPeer, benchPeerPort+1), out, 0x10)
	// Egress, an IPv4 header whose length field says 16 bytes, short of
	// the 20 of a header (BPF_PROG_RUN refuses a packet cut shorter than
	// an IPv4 header).
	short := tcpPacket(out, peer, 0x02)
	short[14] = 0x44

	runPerPacket(t, enf.fromEndpoint, allowed, 3, tcxNextRet)
	runPerPacket(t, enf.toEndpoint, denied, 2, tcxDropRet)
	runPerPacket(t, enf.fromEndpoint, short, 5, tcxDropRet)

	c := readTestCounters(t, maps)
	require.Equal(t, bpfmaps.Counters{
		EgressAllowed: 3, EgressAllowedBytes: 3 * uint64(len(allowed)),
		IngressDropped: 2, IngressDroppedBytes: 2 * uint64(len(denied)),
		EgressDropped: 5, EgressDroppedBytes: 5 * uint64(len(short)),
		Drops: []bpfmaps.DropCount{
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonNoPolicy, Packets: 2, Bytes: 2 * uint64(len(denied))},
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonMalformed},
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonPolicyDeny},
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonVLANTagged},
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonExtHeaders},
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonFragment},
			{Direction: policy.Ingress, Reason: bpfmaps.ReasonSpoofedSource},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonMalformed, Packets: 5, Bytes: 5 * uint64(len(short))},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonPolicyDeny},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonVLANTagged},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonExtHeaders},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonFragment},
			{Direction: policy.Egress, Reason: bpfmaps.ReasonSpoofedSource},
		},
	}, c)
}
