// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/ipcache-agent/ipcache-agent/identity"

	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

// blockPrefix is the i-th of a set of distinct IPv4 prefixes: of the same
// address, /24 and /32.
func blockPrefix(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 9), byte(i >> 1), 0}), 24+8*(i%2))
}

// dumpIPCache reads a map of more entries than one block, read in no
// particular order, into one sorted slice: every entry once, the
// unreadable keys apart, a key with host bits set as its masked prefix.
func TestDumpIPCacheAcrossBlocks(t *testing.T) {
	const n = 2*readBatchSize + 17
	r := newRecordingMaps(t, 0)
	var want []PinnedEntry
	for i := range n {
		p := blockPrefix(i)
		r.ipcache[NewIPCacheMapKey(p)] = NewIPCacheMapValue(uint32(i + 1))
		want = append(want, PinnedEntry{Prefix: p, Identity: identity.Number(i + 1)})
	}
	hostBits := NewIPCacheMapKey(netip.MustParsePrefix("192.168.0.0/16"))
	hostBits[10] = 7 // 192.168.7.0/16
	r.ipcache[hostBits] = NewIPCacheMapValue(99)
	want = append(want, PinnedEntry{Prefix: netip.MustParsePrefix("192.168.0.0/16"), Identity: 99})
	unreadable := NewIPCacheMapKey(netip.MustParsePrefix("10.9.9.0/24"))
	unreadable[7] = 9 // unknown family
	r.ipcache[unreadable] = NewIPCacheMapValue(98)
	slices.SortFunc(want, func(a, b PinnedEntry) int { return prefixkey.Compare(a.Prefix, b.Prefix) })

	snapshot, err := dumpIPCache(r.maps().ipcache, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	require.Greater(t, len(snapshot.entries), 2*readBatchSize, "more than two blocks")
	require.Equal(t, want, snapshot.entries)
	require.Equal(t, map[IPCacheMapKey]IPCacheMapValue{unreadable: NewIPCacheMapValue(98)}, snapshot.unreadable)
}

// snapshotValues answer as a map of the snapshot's keys would, whatever
// the order of the lookups: known keys and their values, values written
// since to known keys (not to others), forgotten keys, unreadable keys.
func TestSnapshotValues(t *testing.T) {
	const n = 1000
	snapshot := ipcacheSnapshot{unreadable: map[IPCacheMapKey]IPCacheMapValue{}}
	want := mapValues[IPCacheMapKey, IPCacheMapValue]{}
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32)
		snapshot.entries = append(snapshot.entries, PinnedEntry{Prefix: p, Identity: identity.Number(i + 1)})
		want[NewIPCacheMapKey(p)] = NewIPCacheMapValue(uint32(i + 1))
	}
	unreadable := NewIPCacheMapKey(netip.MustParsePrefix("10.9.9.0/24"))
	unreadable[4] = 1 // nonzero cluster_id
	snapshot.unreadable[unreadable] = NewIPCacheMapValue(5)
	want[unreadable] = NewIPCacheMapValue(5)
	got := newSnapshotValues(snapshot)

	check := func(k IPCacheMapKey) {
		t.Helper()
		wv, wok := want.get(k)
		gv, gok := got.get(k)
		require.Equal(t, wok, gok, "known %x", k)
		require.Equal(t, wv, gv, "value of %x", k)
	}
	keys := slices.Collect(func(yield func(IPCacheMapKey) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	})
	slices.SortFunc(keys, IPCacheMapKey.compare)
	absent := NewIPCacheMapKey(netip.MustParsePrefix("10.0.0.0/31"))
	hostBits := NewIPCacheMapKey(netip.MustParsePrefix("10.0.0.0/24"))
	hostBits[11] = 1 // 10.0.0.1/24: not the key of an entry
	for _, k := range append(keys, absent, hostBits) {
		check(k) // in order
	}
	for i, k := range keys {
		k2 := keys[(i*7919)%len(keys)] // out of order
		check(k2)
		if i%3 == 0 {
			v := NewIPCacheMapValue(uint32(10_000 + i))
			want.set(k, v)
			got.set(k, v)
		}
		if i%5 == 0 {
			want.forget(k)
			got.forget(k)
		}
	}
	for _, k := range []IPCacheMapKey{absent, hostBits} {
		want.set(k, NewIPCacheMapValue(1))
		got.set(k, NewIPCacheMapValue(1))
	}
	for _, k := range append(keys, absent, hostBits) {
		check(k)
	}
	require.ElementsMatch(t, want.known(), got.known())
	require.Equal(t, NewIPCacheMapValue(5), snapshot.unreadable[unreadable], "the snapshot is not modified")
	require.Equal(t, identity.Number(1), snapshot.entries[0].Identity, "the snapshot is not modified")
}

// BenchmarkPinnedLookup: the ipcache writer's first round after a restart
// of a million prefixes looks each written key up in what the map held at
// start, in key order. "map" builds a Go map of the snapshot first, as the
// writer did before; "snapshot" looks the snapshot up in place.
func BenchmarkPinnedLookup(b *testing.B) {
	const n = 1 << 20
	snapshot := ipcacheSnapshot{unreadable: map[IPCacheMapKey]IPCacheMapValue{}}
	keys := make([]IPCacheMapKey, n)
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
		snapshot.entries = append(snapshot.entries, PinnedEntry{Prefix: p, Identity: identity.Number(i + 1)})
		keys[i] = NewIPCacheMapKey(p)
	}
	lookUp := func(b *testing.B, build func() knownValues[IPCacheMapKey, IPCacheMapValue]) {
		for range b.N {
			known := build()
			for _, k := range keys {
				if _, ok := known.get(k); !ok {
					b.Fatalf("%x not found", k)
				}
			}
		}
	}
	b.Run("map", func(b *testing.B) {
		lookUp(b, func() knownValues[IPCacheMapKey, IPCacheMapValue] {
			m := make(mapValues[IPCacheMapKey, IPCacheMapValue], len(snapshot.entries))
			for _, e := range snapshot.entries {
				m[NewIPCacheMapKey(e.Prefix)] = NewIPCacheMapValue(uint32(e.Identity))
			}
			return m
		})
	})
	b.Run("snapshot", func(b *testing.B) {
		lookUp(b, func() knownValues[IPCacheMapKey, IPCacheMapValue] { return newSnapshotValues(snapshot) })
	})
}
