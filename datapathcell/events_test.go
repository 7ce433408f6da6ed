// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/policy"

	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// rawEvent builds a struct event as enforce.c writes it.
func rawEvent(at uint64, direction policy.Direction, allowed bool, reason bpfmaps.Reason, family, protocol uint8,
	endpoint, remote netip.Addr, endpointPort, remotePort uint16) []byte {
	b := make([]byte, eventSize)
	ne := binary.NativeEndian
	ne.PutUint64(b[0:], at)
	ne.PutUint32(b[8:], 7)
	ne.PutUint32(b[12:], 16777217)
	b[16] = uint8(direction)
	if allowed {
		b[17] = 1
	}
	b[18] = uint8(reason)
	b[19] = family
	b[20] = protocol
	binary.BigEndian.PutUint16(b[24:], endpointPort)
	binary.BigEndian.PutUint16(b[26:], remotePort)
	if family == 1 {
		a, r := endpoint.As4(), remote.As4()
		copy(b[32:], a[:])
		copy(b[48:], r[:])
	} else {
		a, r := endpoint.As16(), remote.As16()
		copy(b[32:], a[:])
		copy(b[48:], r[:])
	}
	return b
}

func TestDecodeEvent(t *testing.T) {
	ep, rem := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.0.2.1")
	wall := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

	// Egress: the endpoint sends, so it is the source.
	e, err := decodeEvent(rawEvent(1_000, policy.Egress, false, bpfmaps.ReasonNoPolicy, 1, 17, ep, rem, 40000, 53), 3_000, wall)
	require.NoError(t, err)
	require.Equal(t, Event{
		Time: wall.Add(-2 * time.Microsecond), Ifindex: 7, Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy,
		Identity: 16777217, Protocol: 17, Src: ep, Dst: rem, SrcPort: 40000, DstPort: 53,
	}, e)
	require.Equal(t, "no-policy", e.Reason.String())

	// Ingress: the remote sends.
	ep6, rem6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	e, err = decodeEvent(rawEvent(3_000, policy.Ingress, true, bpfmaps.ReasonReply, 2, 6, ep6, rem6, 443, 50000), 3_000, wall)
	require.NoError(t, err)
	require.True(t, e.Allowed)
	require.Equal(t, rem6, e.Src)
	require.Equal(t, ep6, e.Dst)
	require.Equal(t, uint16(50000), e.SrcPort)
	require.Equal(t, uint16(443), e.DstPort)
	require.Equal(t, wall, e.Time)

	_, err = decodeEvent(make([]byte, eventSize-1), 0, wall)
	require.ErrorIs(t, err, errShortEvent)
}

func TestReasonNames(t *testing.T) {
	for r, name := range map[bpfmaps.Reason]string{
		bpfmaps.ReasonNoPolicy: "no-policy", bpfmaps.ReasonMalformed: "malformed-ip-header", bpfmaps.ReasonPolicy: "policy",
		bpfmaps.ReasonReply: "reply", bpfmaps.ReasonEstablished: "established", bpfmaps.ReasonRelated: "related", 99: "reason-99",
		bpfmaps.ReasonPolicyDeny: "policy-deny", bpfmaps.ReasonNotDenied: "not-denied",
	} {
		require.Equal(t, name, r.String())
	}
}

// Without a loaded program there is nothing to subscribe to.
func TestSubscribeWithoutProgram(t *testing.T) {
	d := &Datapath{}
	_, _, err := d.Subscribe(EventDrops)
	require.ErrorIs(t, err, ErrNoProgram)
	_, _, err = d.EventsLost()
	require.ErrorIs(t, err, ErrNoProgram)
}

// The program writes a drop event only while drops are asked for, and
// the hub hands it to a subscriber decoded.
func TestPrivilegedProgramWritesEvents(t *testing.T) {
	privileged.Test(t)
	maps := benchMaps(t)
	setEnforced(t, maps, true, true)
	enf, err := loadEnforcer(maps)
	require.NoError(t, err)
	t.Cleanup(func() { enf.Close() })
	d := &Datapath{}
	d.events.setProgram(enf.events, enf.eventsMask)
	t.Cleanup(d.events.close)

	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	reply := tcpPacket(peer, out, 0x10) // untracked: dropped

	// No subscriber: the mask is 0 and nothing is written.
	runPerPacket(t, enf.toEndpoint, reply, 1, tcxDropRet)
	var mask uint32
	require.NoError(t, enf.eventsMask.Get(&mask))
	require.Zero(t, mask)

	verdicts, cancelVerdicts, err := d.Subscribe(EventVerdicts)
	require.NoError(t, err)
	events, cancel, err := d.Subscribe(EventDrops)
	require.NoError(t, err)
	require.NoError(t, enf.eventsMask.Get(&mask))
	require.Equal(t, uint32(EventDrops|EventVerdicts), mask)

	runPerPacket(t, enf.toEndpoint, reply, 1, tcxDropRet)
	select {
	case e := <-events:
		require.False(t, e.Allowed)
		require.Equal(t, bpfmaps.ReasonNoPolicy, e.Reason)
		require.Equal(t, policy.Ingress, e.Direction)
		require.Equal(t, benchPeer, e.Src)
		require.Equal(t, benchEndpoint, e.Dst)
		require.Equal(t, uint16(benchPeerPort), e.SrcPort)
		require.Equal(t, uint16(benchEndpointPort), e.DstPort)
		require.Equal(t, uint8(6), e.Protocol)
		require.WithinDuration(t, time.Now(), e.Time, time.Second)
	case <-time.After(5 * time.Second):
		t.Fatal("no drop event")
	}
	select {
	case e := <-verdicts:
		t.Fatalf("a drop went to a verdict subscriber: %+v", e)
	case <-time.After(50 * time.Millisecond):
	}
	require.Zero(t, cancelVerdicts())
	require.Zero(t, cancel())
	require.NoError(t, enf.eventsMask.Get(&mask))
	require.Zero(t, mask, "the last subscriber gone, the program writes nothing")
	rate, full, err := (&Datapath{enforcer: enf}).EventsLost()
	require.NoError(t, err)
	require.Zero(t, rate+full)
}

func TestEventText(t *testing.T) {
	p := monitorParams{}
	e := Event{
		Time: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC), Ifindex: 1, Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy,
		Identity: 2, Protocol: 1, ICMPType: 8, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("192.0.2.1"),
	}
	var sb strings.Builder
	writeEventText(&sb, p.describe(e, map[uint32]string{1: "veth0"}))
	require.Equal(t, "2026-12-04T12:00:00Z drop (no-policy) on veth0 egress, identity 2 (reserved:world): 10.0.0.1 -> 192.0.2.1 ICMP type 8\n", sb.String())

	e = Event{Time: e.Time, Ifindex: 1, Direction: policy.Ingress, Allowed: true, Reason: bpfmaps.ReasonReply, Identity: 16777217,
		Protocol: 6, Src: e.Dst, Dst: e.Src, SrcPort: 443, DstPort: 40000}
	sb.Reset()
	writeEventText(&sb, p.describe(e, map[uint32]string{1: "veth0"}))
	require.Equal(t, "2026-12-04T12:00:00Z verdict allow (reply) on veth0 ingress, identity 16777217 (): 192.0.2.1:443 -> 10.0.0.1:40000 TCP\n", sb.String())
}
