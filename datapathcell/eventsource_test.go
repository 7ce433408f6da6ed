// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Without a loaded program there is nothing to read.
func TestProgramEventsWithoutProgram(t *testing.T) {
	t.Parallel()
	source := newProgramEvents(&Datapath{})
	_, err := source.Ring()
	require.ErrorIs(t, err, events.ErrNoProgram)
	require.ErrorIs(t, source.SetMask(events.Drops), events.ErrNoProgram)
	_, _, err = source.Lost()
	require.ErrorIs(t, err, events.ErrNoProgram)
}

// The program writes a drop event only while drops are asked for
// (events_mask, set through the Source the monitor reads), and the
// record decodes to the packet.
func TestPrivilegedProgramWritesEvents(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := benchMaps(t)
	setEnforced(t, maps, true, true)
	enf, err := loadEnforcer(maps)
	require.NoError(t, err)
	t.Cleanup(func() { enf.Close() })
	source := newProgramEvents(&Datapath{enforcer: enf})
	ring, err := source.Ring()
	require.NoError(t, err)
	r, err := ringbuf.NewReader(ring)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })

	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	reply := tcpPacket(peer, out, 0x10) // untracked: dropped

	// Nothing asked for: the mask is 0 and nothing is written.
	runPerPacket(t, enf.toEndpoint, reply, 1, tcxDropRet)
	var mask uint32
	require.NoError(t, enf.eventsMask.Get(&mask))
	require.Zero(t, mask)
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	_, err = r.Read()
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "an event with the mask 0: %v", err)

	require.NoError(t, source.SetMask(events.Drops|events.Verdicts))
	require.NoError(t, enf.eventsMask.Get(&mask))
	require.Equal(t, uint32(events.Drops|events.Verdicts), mask)

	runPerPacket(t, enf.toEndpoint, reply, 1, tcxDropRet)
	r.SetDeadline(time.Now().Add(5 * time.Second))
	rec, err := r.Read()
	require.NoError(t, err, "no drop event")
	e, err := events.Decode(rec.RawSample, uint64(bpfmaps.MonotonicNow()), time.Now())
	require.NoError(t, err)
	require.False(t, e.Allowed)
	require.Equal(t, bpfmaps.ReasonNoPolicy, e.Reason)
	require.Equal(t, policy.Ingress, e.Direction)
	require.Equal(t, benchPeer, e.Src)
	require.Equal(t, benchEndpoint, e.Dst)
	require.Equal(t, uint16(benchPeerPort), e.SrcPort)
	require.Equal(t, uint16(benchEndpointPort), e.DstPort)
	require.Equal(t, uint8(6), e.Protocol)
	require.WithinDuration(t, time.Now(), e.Time, time.Second)

	require.NoError(t, source.SetMask(0))
	require.NoError(t, enf.eventsMask.Get(&mask))
	require.Zero(t, mask, "the last subscriber gone, the program writes nothing")
	rate, full, err := source.Lost()
	require.NoError(t, err)
	require.Zero(t, rate+full)
}
