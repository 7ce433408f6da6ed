// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

const (
	testEndpoint4, testPeer4 = "10.200.0.1", "10.200.0.2"
	testIfindex              = 1
)

// mapEntries reads one of the two conntrack maps.
func mapEntries(t *testing.T, m *ebpf.Map) map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue {
	t.Helper()
	out := map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue{}
	require.NoError(t, bpfmaps.ReadEntries(m, func(k bpfmaps.ConntrackKey, v bpfmaps.ConntrackValue) { out[k] = v }))
	return out
}

// putEntry puts the entry of a connection from the endpoint's port to
// port 80 of the peer, expiring at expires.
func putEntry(t *testing.T, m *ebpf.Map, protocol policy.Protocol, port uint16, expires time.Duration, flags uint8) bpfmaps.ConntrackKey {
	t.Helper()
	k := bpfmaps.NewConntrackKey(testIfindex, netip.AddrPortFrom(netip.MustParseAddr(testEndpoint4), port),
		netip.AddrPortFrom(netip.MustParseAddr(testPeer4), 80), uint8(protocol))
	require.NoError(t, m.Put(k, bpfmaps.NewConntrackValue(expires, uint8(policy.Egress), flags)))
	return k
}

// Entries are deleted once expired (the program sets their expiry:
// datapathcell's TestPrivilegedConntrackExpiredEntriesAreCollected).
func TestPrivilegedExpiredEntriesAreCollected(t *testing.T) {
	privileged.Test(t)
	m, err := ebpf.NewMap(bpfmaps.ConntrackOpeningSpec(4096))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	const timeout = 2 * time.Second
	expires := bpfmaps.MonotonicNow() + timeout
	putEntry(t, m, policy.ProtocolUDP, 40000, expires, 0)
	putEntry(t, m, policy.ProtocolICMP, 7, expires, 0)

	gc := newCollector(func() *ebpf.Map { return m }, hivetest.Logger(t))
	done, err := gc.round(context.Background())
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, Stats{Entries: 2, MaxEntries: 4096, Passes: 1}, gc.stats(4096), "nothing expired yet")

	require.Eventually(t, func() bool {
		_, err := gc.round(context.Background())
		require.NoError(t, err)
		return len(mapEntries(t, m)) == 0
	}, 10*time.Second, 100*time.Millisecond, "expired entries not collected")
	st := gc.stats(4096)
	require.EqualValues(t, 2, st.Collected)
	require.Zero(t, st.Entries)
}

// A round reads a bounded number of entries and the next one goes on from
// there; only expired entries are deleted.
func TestPrivilegedCollectionRoundsAreBounded(t *testing.T) {
	privileged.Test(t)
	m, err := ebpf.NewMap(bpfmaps.ConntrackSpec(1024))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	now := bpfmaps.MonotonicNow()
	const expired, alive = 300, 200
	for i := range expired + alive {
		expires := now - time.Second
		if i >= expired {
			expires = now + time.Hour
		}
		putEntry(t, m, policy.ProtocolTCP, uint16(1000+i), expires, bpfmaps.ConntrackEstablished)
	}
	gc := newCollector(func() *ebpf.Map { return m }, hivetest.Logger(t))
	gc.roundLimit, gc.keys, gc.values = 100, make([]bpfmaps.ConntrackKey, 50), make([]bpfmaps.ConntrackValue, 50)
	rounds := 0
	for {
		done, err := gc.round(context.Background())
		require.NoError(t, err)
		rounds++
		if done {
			break
		}
		require.Less(t, rounds, 20)
	}
	require.GreaterOrEqual(t, rounds, (expired+alive)/100, "a round read more than its limit")
	st := gc.stats(m.MaxEntries())
	require.EqualValues(t, expired, st.Collected)
	require.EqualValues(t, alive, st.Entries)
	for _, v := range mapEntries(t, m) {
		require.Greater(t, v.Expires(), now)
	}
	require.Len(t, mapEntries(t, m), alive)
}

// testMaps stands for the datapath: its maps, nil while not open.
type testMaps struct {
	established, opening *ebpf.Map
	full                 uint64
	// deleted counts ConntrackDeleted's calls.
	deleted int
}

var _ bpfmaps.ConntrackMaps = (*testMaps)(nil)

var errNoProgram = errors.New("no program")

func (m *testMaps) ConntrackDeleted()           { m.deleted++ }
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

	datapath := &testMaps{established: established, opening: opening, full: 3}
	tr := newTracker(datapath, hivetest.Logger(t))
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

	require.Zero(t, datapath.deleted)
	n, err := tr.Flush()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, mapEntries(t, established))
	require.Empty(t, mapEntries(t, opening))
	require.Equal(t, 1, datapath.deleted, "the program told that live entries went")
}

func TestProtocolNames(t *testing.T) {
	for p, name := range map[uint8]string{0: "0", 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP", 47: "47"} {
		require.Equal(t, name, policy.Protocol(p).PacketString())
	}
}
