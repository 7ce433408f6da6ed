// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"errors"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// testMaps stands for the datapath: its maps, nil while not open.
type testMaps struct {
	established, opening *ebpf.Map
	full                 uint64
}

var _ bpfmaps.ConntrackMaps = (*testMaps)(nil)

var errNoProgram = errors.New("no program")

func (m *testMaps) Conntrack() *ebpf.Map        { return m.established }
func (m *testMaps) ConntrackOpening() *ebpf.Map { return m.opening }
func (m *testMaps) ConntrackFull() (uint64, error) {
	if m.established == nil {
		return 0, errNoProgram
	}
	return m.full, nil
}

func TestTrackerBeforeStart(t *testing.T) {
	tr := newTracker(&testMaps{}, hivetest.Logger(t))
	_, _, err := tr.List()
	require.ErrorIs(t, err, ErrMapsNotOpen)
	require.EqualError(t, err, "read conntrack map: pinned maps are not open")
	_, err = tr.Flush()
	require.ErrorIs(t, err, ErrMapsNotOpen)
	established, opening := tr.Stats()
	require.Equal(t, Stats{}, established)
	require.Equal(t, Stats{}, opening)
	_, err = tr.Full()
	require.ErrorIs(t, err, errNoProgram)
}

func TestPrivilegedTrackerListAndFlush(t *testing.T) {
	privileged.Test(t)
	established, err := ebpf.NewMap(bpfmaps.ConntrackSpec(1024))
	require.NoError(t, err)
	t.Cleanup(func() { established.Close() })
	opening, err := ebpf.NewMap(bpfmaps.ConntrackOpeningSpec(512))
	require.NoError(t, err)
	t.Cleanup(func() { opening.Close() })
	expires := bpfmaps.MonotonicNow() + time.Hour
	putEntry(t, established, policy.ProtocolTCP, 40000, expires, bpfmaps.ConntrackEstablished|bpfmaps.ConntrackReplySeen)
	putEntry(t, opening, policy.ProtocolUDP, 40001, expires, 0)

	tr := newTracker(&testMaps{established: established, opening: opening, full: 3}, hivetest.Logger(t))
	entries, now, err := tr.List()
	require.NoError(t, err)
	require.Len(t, entries, 2)
	byOpening := map[bool]Entry{}
	for _, e := range entries {
		byOpening[e.Opening] = e
		require.Equal(t, expires, e.Expires)
		require.EqualValues(t, testIfindex, e.Ifindex)
		require.Equal(t, uint8(policy.Egress), e.Origin)
	}
	require.Less(t, now, expires)
	require.Equal(t, uint8(policy.ProtocolTCP), byOpening[false].Protocol)
	require.Equal(t, uint8(policy.ProtocolUDP), byOpening[true].Protocol)
	require.Equal(t, "10.200.0.1:40000", byOpening[false].Endpoint.String())

	st, op := tr.Stats()
	require.EqualValues(t, 1024, st.MaxEntries)
	require.EqualValues(t, 512, op.MaxEntries)
	full, err := tr.Full()
	require.NoError(t, err)
	require.EqualValues(t, 3, full)

	n, err := tr.Flush()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, mapEntries(t, established))
	require.Empty(t, mapEntries(t, opening))
}

func TestProtocolNames(t *testing.T) {
	for p, name := range map[uint8]string{0: "0", 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP", 47: "47"} {
		require.Equal(t, name, policy.Protocol(p).PacketString())
	}
}
