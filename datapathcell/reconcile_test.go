// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// testEntry is an object of a table written to the policy map.
type testEntry struct {
	identity uint32
}

func batchOf(entries ...*testEntry) []reconciler.BatchEntry[*testEntry] {
	batch := make([]reconciler.BatchEntry[*testEntry], len(entries))
	for i, e := range entries {
		batch[i].Object = e
	}
	return batch
}

// TestFullMapLogsOncePerTransition: a full map logs one line when the
// first key does not fit and one when every key that did not fit is
// written again, however many keys fail and however often they are
// retried; NoRoom counts the keys left out. It writes the recording fake
// of the policy map (order_test.go), which says E2BIG as a full hash map
// does.
func TestFullMapLogsOncePerTransition(t *testing.T) {
	t.Parallel()
	r := newRecordingMaps(t, 2)
	policyMap := r.maps().policy
	var logged bytes.Buffer
	ops := &mapwrite.Ops[*testEntry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]{
		Name:   bpfmaps.PolicyName,
		Target: func() mapwrite.Map { return policyMap },
		Key:    func(e *testEntry) bpfmaps.PolicyKey { return policyMapKey(e.identity, uint8(policy.Egress), 0, 0) },
		Value:  func(*testEntry) bpfmaps.PolicyValue { return bpfmaps.NewPolicyValue(1) },
		Stats:  &mapwrite.Stats{},
		Log:    slog.New(slog.NewTextHandler(&logged, nil)),
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
	require.Equal(t, int64(4), ops.Stats.NoRoom.Load())
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
	require.Equal(t, int64(2), ops.Stats.NoRoom.Load())
	require.Len(t, lines(), 1, "not every key is written yet")

	// One is written, the other is no longer wanted: room again.
	ops.DeleteBatch(context.Background(), nil, batchOf(entries[2]))
	require.NoError(t, ops.Update(context.Background(), nil, 0, entries[4]))
	ops.DeleteBatch(context.Background(), nil, batchOf(entries[5]))
	require.Equal(t, int64(0), ops.Stats.NoRoom.Load())
	require.Len(t, lines(), 2)
	require.Contains(t, lines()[1], "level=INFO msg=\"The policy map has room again")

	// Full again (entries 3 and 4 fill it): one more line.
	require.ErrorIs(t, ops.Update(context.Background(), nil, 0, entries[0]), unix.E2BIG)
	require.Len(t, lines(), 3)
	require.Contains(t, lines()[2], "The policy map is full")
}
