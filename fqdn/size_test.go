// SPDX-License-Identifier: Apache-2.0

package fqdn

import (
	"net/netip"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLearnAndExpire100k learns 100,000 names, expires them, and checks
// that nothing is left behind: the maps and heaps empty and small again,
// and the heap back where it was.
func TestLearnAndExpire100k(t *testing.T) {
	const n = 100_000
	now := time.Unix(1e9, 0)
	c := NewCache(Config{MaxLive: n}, func() time.Time { return now })
	heapAlloc := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heapAlloc()
	for round := range 2 {
		for i := range n {
			u := c.Add(Answer{
				Question:  "n" + strconv.Itoa(i) + ".example.com",
				Addresses: []Address{{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), TTL: uint32(1 + i%30)}},
			})
			if len(u.Added) != 1 || u.Deferred != 0 {
				t.Fatalf("learning name %d: %+v", i, u)
			}
		}
		require.Equal(t, Stats{Names: n, Addresses: n, Live: n}, c.Stats())
		now = now.Add(31 * time.Second)
		removed := c.GC(nil)
		require.Len(t, removed, n, "round %d", round)
		for _, r := range removed {
			if !r.Last {
				t.Fatalf("%s %s removed, not the last of its address", r.Name, r.Addr)
			}
		}
		require.Empty(t, c.names)
		require.Empty(t, c.addrs)
		require.Empty(t, c.live.slots)
		require.Empty(t, c.deferred.slots)
		require.LessOrEqual(t, cap(c.live.slots), 64)
		require.LessOrEqual(t, cap(c.deferred.slots), 64)
	}
	after := heapAlloc()
	runtime.KeepAlive(c)
	t.Logf("heap with the cache new: %d bytes; after two rounds of %d names: %d", before, n, after)
	require.Less(t, int64(after)-int64(before), int64(256<<10), "heap grew from %d to %d bytes with the cache empty", before, after)
}
