// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// pinnedSnapshot returns what a started datapath read of the pinned
// ipcache map as prefix -> identity, reading the stream to its end (the
// test is its one reader, as restore is in the agent), after checking that
// every entry came once and that the writer's snapshot of the read holds
// the same entries in address order (the order restore writes them in).
func pinnedSnapshot(tb testing.TB, a *agent) map[netip.Prefix]uint32 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pinned := map[netip.Prefix]uint32{}
	for block, err := range a.pinned.Blocks(ctx) {
		require.NoError(tb, err)
		for _, e := range block {
			_, twice := pinned[e.Prefix]
			require.False(tb, twice, "%s streamed twice", e.Prefix)
			pinned[e.Prefix] = uint32(e.Identity)
		}
	}
	require.Equal(tb, pinned, writerSnapshot(tb, a.datapath), "the stream and the snapshot")
	return pinned
}

// writerSnapshot returns the ipcache writer's snapshot of the read as
// prefix -> identity, after checking that it is in address order.
func writerSnapshot(tb testing.TB, d *datapathcell.Datapath) map[netip.Prefix]uint32 {
	tb.Helper()
	entries := datapathcell.PinnedSnapshot(d)
	require.True(tb, slices.IsSortedFunc(entries, func(a, b bpfmaps.IPCacheEntry) int {
		return prefixkey.Compare(a.Prefix, b.Prefix)
	}), "snapshot in address order")
	snapshot := map[netip.Prefix]uint32{}
	for _, e := range entries {
		snapshot[e.Prefix] = uint32(e.Identity)
	}
	return snapshot
}

// TestPrivilegedStreamGivesThePinnedMap: the reader of the stream gets
// every entry of the pinned map once, in blocks, as the snapshot has
// them; a block is given once.
func TestPrivilegedStreamGivesThePinnedMap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "")
	h, err := first.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	// More than two of the read's blocks (4096 entries each).
	_, want := upsertHosts(t, h, 10, 1, 10000, 7000)
	e.waitIPCache(t, want)
	first.stop()

	second, _ := e.start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	streamed := map[netip.Prefix]uint32{}
	blocks := 0
	for block, err := range second.pinned.Blocks(ctx) {
		require.NoError(t, err)
		blocks++
		for _, entry := range block {
			_, twice := streamed[entry.Prefix]
			require.False(t, twice, "%s streamed twice", entry.Prefix)
			streamed[entry.Prefix] = uint32(entry.Identity)
		}
	}
	require.GreaterOrEqual(t, blocks, 3)
	require.Equal(t, want, streamed)
	require.Equal(t, want, writerSnapshot(t, second.datapath))

	for block, err := range second.pinned.Blocks(ctx) {
		require.NoError(t, err)
		require.Empty(t, block, "ranged over a second time: a block given again")
	}
}
