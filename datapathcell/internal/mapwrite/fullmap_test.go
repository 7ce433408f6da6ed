// SPDX-License-Identifier: Apache-2.0

package mapwrite

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// These extend reconcile_test.go (TestPrivilegedBatchUpdatePartialFailure,
// TestPrivilegedPerKeyFallback) with what a full map does to a batch whose
// failure is not at its end, to the policy map, and to the skip of
// unchanged entries after a restart. datapathcell/testdata/full-*-map.txtar
// show the same through the whole agent: health, statuses, retries,
// convergence.

// TestPrivilegedFullIPCacheBatchResultPerEntry: in a full LPM trie, a batch
// whose first entry does not fit still writes the entries after it that
// do (an in-place update of a key the map has), and each entry's result is
// its own: ENOSPC for the new keys, nil for the update.
func TestPrivilegedFullIPCacheBatchResultPerEntry(t *testing.T) {
	ops, m := newTestOps(t, 2)
	a := &testEntry{netip.MustParsePrefix("10.0.0.1/32"), 100}
	b := &testEntry{netip.MustParsePrefix("10.0.0.2/32"), 200}
	fill := batchOf(a, b)
	ops.UpdateBatch(context.Background(), nil, fill)
	require.NoError(t, fill[0].Result)
	require.NoError(t, fill[1].Result)

	c := &testEntry{netip.MustParsePrefix("10.0.0.3/32"), 300}
	aChanged := &testEntry{a.prefix, 101}
	d := &testEntry{netip.MustParsePrefix("10.0.1.0/24"), 400}
	batch := batchOf(c, aChanged, d)
	ops.UpdateBatch(context.Background(), nil, batch)
	require.ErrorIs(t, batch[0].Result, unix.ENOSPC, "a new key does not fit")
	require.NoError(t, batch[1].Result, "an update in place fits, though it comes after a failure")
	require.ErrorIs(t, batch[2].Result, unix.ENOSPC)
	require.Contains(t, batch[0].Result.Error(), "test map", "the error names the map")

	require.Equal(t, map[netip.Prefix]uint32{a.prefix: 101, b.prefix: 200}, dumpTestMap(t, m),
		"what fit is kept, with the new value")

	// The reconciler retries the failed ones; once b leaves, one of them
	// fits, and the other still gets its own error.
	del := batchOf(b)
	ops.DeleteBatch(context.Background(), nil, del)
	require.NoError(t, del[0].Result)
	retry := batchOf(c, d)
	ops.UpdateBatch(context.Background(), nil, retry)
	require.NoError(t, retry[0].Result)
	require.ErrorIs(t, retry[1].Result, unix.ENOSPC)
	require.Equal(t, map[netip.Prefix]uint32{a.prefix: 101, c.prefix: 300}, dumpTestMap(t, m))
}

// TestPrivilegedFullPolicyMapPartialBatch: the policy map is an LPM trie;
// a full one fails with ENOSPC per entry that does not fit, keeps every
// entry that does, and takes the rest when room appears.
func TestPrivilegedFullPolicyMapPartialBatch(t *testing.T) {
	privileged.Test(t)
	m, err := ebpf.NewMap(bpfmaps.PolicySpec(2))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	type policyEntry struct{ identity, verdict uint32 }
	ops := &Ops[*policyEntry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]{
		Name:   bpfmaps.PolicyName,
		Target: func() Map { return m },
		Key:    func(e *policyEntry) bpfmaps.PolicyKey { return egressKey(e.identity) },
		Value:  func(e *policyEntry) bpfmaps.PolicyValue { return bpfmaps.NewPolicyValue(e.verdict) },
		Stats:  &Stats{},
	}
	entries := []*policyEntry{{16777217, 1}, {16777218, 1}, {16777219, 1}, {16777220, 1}}
	batch := make([]reconciler.BatchEntry[*policyEntry], len(entries))
	for i, e := range entries {
		batch[i].Object = e
	}
	ops.UpdateBatch(context.Background(), nil, batch)
	require.NoError(t, batch[0].Result)
	require.NoError(t, batch[1].Result)
	require.ErrorIs(t, batch[2].Result, unix.ENOSPC, "the trie is full")
	require.ErrorIs(t, batch[3].Result, unix.ENOSPC)
	require.Contains(t, batch[2].Result.Error(), "policy map")
	require.Equal(t, uint64(2), ops.Stats.Written.Load())

	var v bpfmaps.PolicyValue
	for _, e := range entries[:2] {
		require.NoError(t, m.Lookup(egressKey(e.identity), &v), "kept: %d", e.identity)
	}

	del := []reconciler.BatchEntry[*policyEntry]{{Object: entries[0]}, {Object: entries[1]}}
	ops.DeleteBatch(context.Background(), nil, del)
	require.NoError(t, del[0].Result)
	require.NoError(t, del[1].Result)
	retry := []reconciler.BatchEntry[*policyEntry]{{Object: entries[2]}, {Object: entries[3]}}
	ops.UpdateBatch(context.Background(), nil, retry)
	require.NoError(t, retry[0].Result, "room appeared")
	require.NoError(t, retry[1].Result)
	for _, e := range entries[2:] {
		require.NoError(t, m.Lookup(egressKey(e.identity), &v))
	}
}

// TestPrivilegedFullMapAfterRestartSkipsUnchanged: a map that is full when
// the agent starts (it holds what the previous run wrote) is not an error
// for the entries it already holds: they are not written again, and only
// the entry that needs room fails.
func TestPrivilegedFullMapAfterRestartSkipsUnchanged(t *testing.T) {
	ops, m := newTestOps(t, 2)
	a := &testEntry{netip.MustParsePrefix("10.0.0.1/32"), 100}
	b := &testEntry{netip.MustParsePrefix("10.0.0.2/32"), 200}
	for _, e := range []*testEntry{a, b} {
		k, v := bpfmaps.NewIPCacheKey(e.prefix), bpfmaps.NewIPCacheValue(identity.Number(e.identity))
		require.NoError(t, m.Put(&k, &v), "written by the previous run")
	}
	c := &testEntry{netip.MustParsePrefix("10.0.0.3/32"), 300}
	batch := batchOf(a, b, c)
	ops.UpdateBatch(context.Background(), nil, batch)
	require.NoError(t, batch[0].Result)
	require.NoError(t, batch[1].Result)
	require.ErrorIs(t, batch[2].Result, unix.ENOSPC)
	require.Equal(t, uint64(2), ops.Stats.Unchanged.Load(), "what the map holds is not written again")
	require.Equal(t, map[netip.Prefix]uint32{a.prefix: 100, b.prefix: 200}, dumpTestMap(t, m))
}

func dumpTestMap(t *testing.T, m *ebpf.Map) map[netip.Prefix]uint32 {
	t.Helper()
	got := map[netip.Prefix]uint32{}
	var (
		k bpfmaps.IPCacheKey
		v bpfmaps.IPCacheValue
	)
	iter := m.Iterate()
	for iter.Next(&k, &v) {
		p, err := k.Prefix()
		require.NoError(t, err)
		got[p] = uint32(v.Identity())
	}
	require.NoError(t, iter.Err())
	return got
}

// egressKey is the policy map key of a rule that allows egress to ident,
// any protocol and port.
func egressKey(ident uint32) bpfmaps.PolicyKey {
	return bpfmaps.NewPolicyKey(policy.Key{Identity: identity.Number(ident), Direction: policy.Egress})
}
