// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
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
