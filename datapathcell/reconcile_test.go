// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"

	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

type testEntry struct {
	prefix   netip.Prefix
	identity uint32
}

func newTestOps(t *testing.T, maxEntries uint32) (*mapOps[*testEntry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue], *ebpf.Map) {
	privileged.Test(t)
	m, err := ebpf.NewMap(bpfmaps.IPCacheSpec(maxEntries))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return &mapOps[*testEntry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]{
		name:   "test",
		target: func() kernelMap { return m },
		key:    func(e *testEntry) bpfmaps.IPCacheKey { return bpfmaps.NewIPCacheKey(e.prefix) },
		value:  func(e *testEntry) bpfmaps.IPCacheValue { return bpfmaps.NewIPCacheValue(identity.Number(e.identity)) },
		stats:  &mapStats{},
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
	require.Equal(t, uint64(2), ops.stats.Written.Load())

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
	require.Equal(t, uint64(1), ops.stats.Prunes.Load())

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

// TestFullMapLogsOncePerTransition: a full map logs one line when the
// first key does not fit and one when every key that did not fit is
// written again, however many keys fail and however often they are
// retried; NoRoom counts the keys left out.
func TestFullMapLogsOncePerTransition(t *testing.T) {
	r := newRecordingMaps(t, 2)
	policyMap := r.maps().policy
	var logged bytes.Buffer
	ops := &mapOps[*testEntry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]{
		name:   bpfmaps.PolicyName,
		target: func() kernelMap { return policyMap },
		key:    func(e *testEntry) bpfmaps.PolicyKey { return policyMapKey(e.identity, uint8(policy.Egress), 0, 0) },
		value:  func(*testEntry) bpfmaps.PolicyValue { return bpfmaps.NewPolicyValue(1) },
		stats:  &mapStats{},
		log:    slog.New(slog.NewTextHandler(&logged, nil)),
	}
	entries := make([]*testEntry, 6)
	for i := range entries {
		entries[i] = &testEntry{identity: 16777217 + uint32(i)}
	}
	lines := func() []string { return strings.Split(strings.TrimSpace(logged.String()), "\n") }

	batch := batchOf(entries...)
	ops.UpdateBatch(context.Background(), nil, batch)
	for _, e := range batch[2:] {
		require.ErrorIs(t, e.Result, unix.E2BIG)
	}
	require.Equal(t, int64(4), ops.stats.NoRoom.Load())
	require.Len(t, lines(), 1, "one line for the map becoming full, not one per key")
	require.Contains(t, lines()[0], "level=WARN msg=\"The policy map is full")
	require.Contains(t, lines()[0], "max-entries=2 flag=--policy-map-max-entries")

	// Retries of keys still left out log nothing.
	for range 3 {
		for _, e := range entries[2:] {
			require.Error(t, ops.Update(context.Background(), nil, 0, e))
		}
	}
	require.Len(t, lines(), 1, "retries log nothing")

	// Room for two: two more keys are written, two are still left out.
	ops.DeleteBatch(context.Background(), nil, batchOf(entries[:2]...))
	retry := batchOf(entries[2:]...)
	ops.UpdateBatch(context.Background(), nil, retry)
	require.NoError(t, retry[0].Result)
	require.NoError(t, retry[1].Result)
	require.Equal(t, int64(2), ops.stats.NoRoom.Load())
	require.Len(t, lines(), 1, "not every key is written yet")

	// One is written, the other is no longer wanted: room again.
	ops.DeleteBatch(context.Background(), nil, batchOf(entries[2]))
	require.NoError(t, ops.Update(context.Background(), nil, 0, entries[4]))
	ops.DeleteBatch(context.Background(), nil, batchOf(entries[5]))
	require.Equal(t, int64(0), ops.stats.NoRoom.Load())
	require.Len(t, lines(), 2)
	require.Contains(t, lines()[1], "level=INFO msg=\"The policy map has room again")

	// Full again (entries 3 and 4 fill it): one more line.
	require.ErrorIs(t, ops.Update(context.Background(), nil, 0, entries[0]), unix.E2BIG)
	require.Len(t, lines(), 3)
	require.Contains(t, lines()[2], "The policy map is full")
}
