// SPDX-License-Identifier: Apache-2.0

package events

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// rawEvent builds a struct event as enforce.c writes it.
func rawEvent(at uint64, direction policy.Direction, allowed bool, reason bpfmaps.Reason, family, protocol uint8,
	endpoint, remote netip.Addr, endpointPort, remotePort uint16) []byte {
	b := make([]byte, Size)
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
	e, err := Decode(rawEvent(1_000, policy.Egress, false, bpfmaps.ReasonNoPolicy, 1, 17, ep, rem, 40000, 53), 3_000, wall)
	require.NoError(t, err)
	require.Equal(t, Event{
		Time: wall.Add(-2 * time.Microsecond), Ifindex: 7, Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy,
		Identity: 16777217, Protocol: 17, Src: ep, Dst: rem, SrcPort: 40000, DstPort: 53,
	}, e)
	require.Equal(t, "no-policy", e.Reason.String())

	// Ingress: the remote sends.
	ep6, rem6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	e, err = Decode(rawEvent(3_000, policy.Ingress, true, bpfmaps.ReasonReply, 2, 6, ep6, rem6, 443, 50000), 3_000, wall)
	require.NoError(t, err)
	require.True(t, e.Allowed)
	require.Equal(t, rem6, e.Src)
	require.Equal(t, ep6, e.Dst)
	require.Equal(t, uint16(50000), e.SrcPort)
	require.Equal(t, uint16(443), e.DstPort)
	require.Equal(t, wall, e.Time)

	// The local endpoint whose policy decided, after the ports.
	raw := rawEvent(3_000, policy.Egress, false, bpfmaps.ReasonSpoofedSource, 1, 6, ep, rem, 40000, 80)
	binary.NativeEndian.PutUint32(raw[28:], 300)
	e, err = Decode(raw, 3_000, wall)
	require.NoError(t, err)
	require.Equal(t, identity.Number(300), e.Endpoint)
	require.Equal(t, "spoofed-source", e.Reason.String())

	_, err = Decode(make([]byte, Size-1), 0, wall)
	require.ErrorIs(t, err, errShortEvent)

	require.Equal(t, uint64(3_000), Timestamp(rawEvent(3_000, policy.Ingress, true, bpfmaps.ReasonReply, 2, 6, ep6, rem6, 443, 50000)))
	require.Zero(t, Timestamp(make([]byte, Size-1)))
}

// TestEventSize: the generated type is the program's struct event, one
// ring-buffer record of Size bytes (a field added to the C struct without
// regenerating, or Size not updated, fails here).
func TestEventSize(t *testing.T) {
	require.Equal(t, Size, binary.Size(bpf.EnforceEvent{}))
}
