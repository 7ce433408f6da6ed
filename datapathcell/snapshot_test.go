// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// pinnedSnapshot returns a started datapath's snapshot of the pinned
// ipcache map as prefix -> identity, after checking that it is in address
// order (the order restore writes it in).
func pinnedSnapshot(tb testing.TB, d *datapathcell.Datapath) map[netip.Prefix]uint32 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	entries, err := d.IPCacheSnapshot(ctx)
	require.NoError(tb, err)
	require.True(tb, slices.IsSortedFunc(entries, func(a, b datapathcell.PinnedEntry) int {
		return prefixkey.Compare(a.Prefix, b.Prefix)
	}), "snapshot in address order")
	pinned := map[netip.Prefix]uint32{}
	for _, e := range entries {
		pinned[e.Prefix] = uint32(e.Identity)
	}
	return pinned
}

// TestPrivilegedStreamGivesThePinnedMap: a reader that took the stream
// before start gets every entry of the pinned map once, in blocks, as the
// snapshot has them; the stream is one reader's.
func TestPrivilegedStreamGivesThePinnedMap(t *testing.T) {
	e := newEnv(t)
	first, _ := e.start(t, "")
	h, err := first.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	// More than two of the read's blocks (4096 entries each).
	_, want := upsertHosts(t, h, 10, 1, 10000, 7000)
	e.waitIPCache(t, want)
	first.stop()

	var stream *datapathcell.PinnedIPCacheStream
	second, _ := e.startWith(t, cell.Invoke(func(d *datapathcell.Datapath) (err error) {
		stream, err = d.StreamPinnedIPCache()
		return err
	}), "")
	_, err = second.datapath.StreamPinnedIPCache()
	require.ErrorIs(t, err, datapathcell.ErrStreamTaken, "after start")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	streamed := map[netip.Prefix]uint32{}
	blocks := 0
	for block, err := range stream.Blocks(ctx) {
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
	require.Equal(t, want, pinnedSnapshot(t, second.datapath))

	var errs []error
	for _, err := range stream.Blocks(ctx) {
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], datapathcell.ErrStreamTaken, "ranged over twice")
}
