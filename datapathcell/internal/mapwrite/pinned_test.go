// SPDX-License-Identifier: Apache-2.0

package mapwrite

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
)

// snapshotValues answer as a map of the snapshot's keys would, whatever
// the order of the lookups: known keys and their values, values written
// since to known keys (not to others), forgotten keys, unreadable keys.
func TestSnapshotValues(t *testing.T) {
	const n = 1000
	snapshot := bpfmaps.IPCacheSnapshot{Unreadable: map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue{}}
	want := mapValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]{}
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32)
		snapshot.Entries = append(snapshot.Entries, bpfmaps.IPCacheEntry{Prefix: p, Identity: identity.Number(i + 1)})
		want[bpfmaps.NewIPCacheKey(p)] = bpfmaps.NewIPCacheValue(identity.Number(i + 1))
	}
	unreadable := bpfmaps.NewIPCacheKey(netip.MustParsePrefix("10.9.9.0/24"))
	unreadable[4] = 1 // nonzero cluster_id
	snapshot.Unreadable[unreadable] = bpfmaps.NewIPCacheValue(5)
	want[unreadable] = bpfmaps.NewIPCacheValue(5)
	got := NewSnapshotValues(snapshot)

	check := func(k bpfmaps.IPCacheKey) {
		t.Helper()
		wv, wok := want.get(k)
		gv, gok := got.get(k)
		require.Equal(t, wok, gok, "known %x", k)
		require.Equal(t, wv, gv, "value of %x", k)
	}
	keys := slices.Collect(func(yield func(bpfmaps.IPCacheKey) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	})
	slices.SortFunc(keys, bpfmaps.IPCacheKey.Compare)
	absent := bpfmaps.NewIPCacheKey(netip.MustParsePrefix("10.0.0.0/31"))
	hostBits := bpfmaps.NewIPCacheKey(netip.MustParsePrefix("10.0.0.0/24"))
	hostBits[11] = 1 // 10.0.0.1/24: not the key of an entry
	for _, k := range append(keys, absent, hostBits) {
		check(k) // in order
	}
	for i, k := range keys {
		k2 := keys[(i*7919)%len(keys)] // out of order
		check(k2)
		if i%3 == 0 {
			v := bpfmaps.NewIPCacheValue(identity.Number(10_000 + i))
			want.set(k, v)
			got.set(k, v)
		}
		if i%5 == 0 {
			want.forget(k)
			got.forget(k)
		}
	}
	for _, k := range []bpfmaps.IPCacheKey{absent, hostBits} {
		want.set(k, bpfmaps.NewIPCacheValue(1))
		got.set(k, bpfmaps.NewIPCacheValue(1))
	}
	for _, k := range append(keys, absent, hostBits) {
		check(k)
	}
	require.ElementsMatch(t, want.known(), got.known())
	require.Equal(t, bpfmaps.NewIPCacheValue(5), snapshot.Unreadable[unreadable], "the snapshot is not modified")
	require.Equal(t, identity.Number(1), snapshot.Entries[0].Identity, "the snapshot is not modified")
}

// BenchmarkPinnedLookup: the ipcache writer's first round after a restart
// of a million prefixes looks each written key up in what the map held at
// start, in key order. "map" builds a Go map of the snapshot first, as the
// writer did before; "snapshot" looks the snapshot up in place.
func BenchmarkPinnedLookup(b *testing.B) {
	const n = 1 << 20
	snapshot := bpfmaps.IPCacheSnapshot{Unreadable: map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue{}}
	keys := make([]bpfmaps.IPCacheKey, n)
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
		snapshot.Entries = append(snapshot.Entries, bpfmaps.IPCacheEntry{Prefix: p, Identity: identity.Number(i + 1)})
		keys[i] = bpfmaps.NewIPCacheKey(p)
	}
	lookUp := func(b *testing.B, build func() KnownValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]) {
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
		lookUp(b, func() KnownValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue] {
			m := make(mapValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue], len(snapshot.Entries))
			for _, e := range snapshot.Entries {
				m[bpfmaps.NewIPCacheKey(e.Prefix)] = bpfmaps.NewIPCacheValue(e.Identity)
			}
			return m
		})
	})
	b.Run("snapshot", func(b *testing.B) {
		lookUp(b, func() KnownValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue] { return NewSnapshotValues(snapshot) })
	})
}
