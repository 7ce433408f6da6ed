// SPDX-License-Identifier: Apache-2.0

package mapwrite

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

type testEntry struct {
	prefix   netip.Prefix
	identity uint32
}

func newTestOps(t *testing.T, maxEntries uint32) (*Ops[*testEntry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue], *ebpf.Map) {
	privileged.Test(t)
	m, err := ebpf.NewMap(bpfmaps.IPCacheSpec(maxEntries))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return &Ops[*testEntry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]{
		Name:   "test",
		Target: func() Map { return m },
		Key:    func(e *testEntry) bpfmaps.IPCacheKey { return bpfmaps.NewIPCacheKey(e.prefix) },
		Value:  func(e *testEntry) bpfmaps.IPCacheValue { return bpfmaps.NewIPCacheValue(identity.Number(e.identity)) },
		Stats:  &Stats{},
	}, m
}

func batchOf(entries ...*testEntry) []reconciler.BatchEntry[*testEntry] {
	batch := make([]reconciler.BatchEntry[*testEntry], len(entries))
	for i, e := range entries {
		batch[i].Object = e
	}
	return batch
}

// TestPrivilegedBatchUpdatePartialFailure: a full map takes what fits; the
// objects that did not fit, and only those, get an error, and the next try
// succeeds once there is room.
func TestPrivilegedBatchUpdatePartialFailure(t *testing.T) {
	ops, m := newTestOps(t, 2)
	a := &testEntry{netip.MustParsePrefix("10.0.0.1/32"), 100}
	b := &testEntry{netip.MustParsePrefix("10.0.0.2/32"), 200}
	c := &testEntry{netip.MustParsePrefix("10.0.0.3/32"), 300}

	batch := batchOf(a, b, c)
	ops.UpdateBatch(context.Background(), nil, batch)
	require.NoError(t, batch[0].Result)
	require.NoError(t, batch[1].Result)
	require.Error(t, batch[2].Result, "the third entry does not fit")
	require.Equal(t, uint64(2), ops.Stats.Written.Load())

	del := batchOf(a)
	ops.DeleteBatch(context.Background(), nil, del)
	require.NoError(t, del[0].Result)
	retry := batchOf(c)
	ops.UpdateBatch(context.Background(), nil, retry)
	require.NoError(t, retry[0].Result, "room appeared")

	var v bpfmaps.IPCacheValue
	require.NoError(t, m.Lookup(bpfmaps.NewIPCacheKey(c.prefix), &v))
	require.Equal(t, identity.Number(300), v.Identity())
	require.Error(t, m.Lookup(bpfmaps.NewIPCacheKey(a.prefix), &v), "deleted")
}

// TestPrivilegedPerKeyFallback: once the kernel says a map has no batch
// operations, writes go one key at a time, with the same results.
func TestPrivilegedPerKeyFallback(t *testing.T) {
	ops, m := newTestOps(t, 10)
	ops.noBatch = true
	a := &testEntry{netip.MustParsePrefix("10.0.0.0/8"), 1}
	batch := batchOf(a)
	ops.UpdateBatch(context.Background(), nil, batch)
	require.NoError(t, batch[0].Result)
	var v bpfmaps.IPCacheValue
	require.NoError(t, m.Lookup(bpfmaps.NewIPCacheKey(a.prefix), &v))

	del := batchOf(a, &testEntry{netip.MustParsePrefix("192.0.2.0/24"), 2})
	ops.DeleteBatch(context.Background(), nil, del)
	require.NoError(t, del[0].Result)
	require.NoError(t, del[1].Result, "deleting a key the map does not have is fine")
	require.Error(t, m.Lookup(bpfmaps.NewIPCacheKey(a.prefix), &v))
}

// TestPrivilegedPruneRemovesWhatNoObjectHas: the first prune finds stale
// keys without reading the map (from what was read before the first write
// and written since), later ones read it; both leave exactly the desired
// keys, a key whose write failed included.
func TestPrivilegedPruneRemovesWhatNoObjectHas(t *testing.T) {
	ops, m := newTestOps(t, 3)
	stale := &testEntry{netip.MustParsePrefix("10.0.0.9/32"), 900} // the previous run's
	require.NoError(t, m.Put(bpfmaps.NewIPCacheKey(stale.prefix), bpfmaps.NewIPCacheValue(identity.Number(stale.identity))))
	a := &testEntry{netip.MustParsePrefix("10.0.0.1/32"), 100}
	b := &testEntry{netip.MustParsePrefix("10.0.0.2/32"), 200}
	c := &testEntry{netip.MustParsePrefix("10.0.0.3/32"), 300}
	batch := batchOf(a, b, c)
	ops.UpdateBatch(context.Background(), nil, batch)
	require.Error(t, batch[2].Result, "the map is full: c's write fails")
	gone := batchOf(b)
	ops.DeleteBatch(context.Background(), nil, gone)
	require.NoError(t, gone[0].Result)

	dump := func() map[netip.Prefix]uint32 {
		out := map[netip.Prefix]uint32{}
		require.NoError(t, bpfmaps.ReadEntries(m, func(k bpfmaps.IPCacheKey, v bpfmaps.IPCacheValue) {
			prefix, err := k.Prefix()
			require.NoError(t, err)
			out[prefix] = uint32(v.Identity())
		}))
		return out
	}
	desired := func(entries ...*testEntry) func(func(*testEntry, uint64) bool) {
		return func(yield func(*testEntry, uint64) bool) {
			for _, e := range entries {
				if !yield(e, 0) {
					return
				}
			}
		}
	}
	require.NoError(t, ops.Prune(context.Background(), nil, desired(a, c)))
	require.Equal(t, map[netip.Prefix]uint32{a.prefix: 100}, dump(), "stale key pruned, a kept")
	require.Equal(t, uint64(1), ops.Stats.Prunes.Load())

	// Now there is room for c; something else put a key in (a later prune
	// reads the map).
	retry := batchOf(c)
	ops.UpdateBatch(context.Background(), nil, retry)
	require.NoError(t, retry[0].Result)
	require.NoError(t, m.Put(bpfmaps.NewIPCacheKey(stale.prefix), bpfmaps.NewIPCacheValue(identity.Number(stale.identity))))
	require.NoError(t, ops.Prune(context.Background(), nil, desired(a, c)))
	require.Equal(t, map[netip.Prefix]uint32{a.prefix: 100, c.prefix: 300}, dump())
}

// TestPrivilegedFirstPruneBeforeAnyWrite: with nothing written yet, the
// first prune reads the map.
func TestPrivilegedFirstPruneBeforeAnyWrite(t *testing.T) {
	ops, m := newTestOps(t, 3)
	stale := &testEntry{netip.MustParsePrefix("10.0.0.9/32"), 900}
	require.NoError(t, m.Put(bpfmaps.NewIPCacheKey(stale.prefix), bpfmaps.NewIPCacheValue(identity.Number(stale.identity))))
	require.NoError(t, ops.Prune(context.Background(), nil, func(func(*testEntry, uint64) bool) {}))
	var v bpfmaps.IPCacheValue
	require.Error(t, m.Lookup(bpfmaps.NewIPCacheKey(stale.prefix), &v), "pruned")
}
