// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
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
	t.Parallel()
	const n = 2*readBatchSize + 17
	r := newRecordingMaps(t, 0)
	var want []bpfmaps.IPCacheEntry
	for i := range n {
		p := blockPrefix(i)
		r.ipcache[bpfmaps.NewIPCacheKey(p)] = bpfmaps.NewIPCacheValue(identity.Number(i + 1))
		want = append(want, bpfmaps.IPCacheEntry{Prefix: p, Identity: identity.Number(i + 1)})
	}
	hostBits := bpfmaps.NewIPCacheKey(netip.MustParsePrefix("192.168.0.0/16"))
	hostBits[10] = 7 // 192.168.7.0/16
	r.ipcache[hostBits] = bpfmaps.NewIPCacheValue(99)
	want = append(want, bpfmaps.IPCacheEntry{Prefix: netip.MustParsePrefix("192.168.0.0/16"), Identity: 99})
	unreadable := bpfmaps.NewIPCacheKey(netip.MustParsePrefix("10.9.9.0/24"))
	unreadable[7] = 9 // unknown family
	r.ipcache[unreadable] = bpfmaps.NewIPCacheValue(98)
	slices.SortFunc(want, func(a, b bpfmaps.IPCacheEntry) int { return prefixkey.Compare(a.Prefix, b.Prefix) })

	snapshot, err := bpfmaps.ReadIPCacheMap(r.maps().ipcache, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	require.Greater(t, len(snapshot.Entries), 2*readBatchSize, "more than two blocks")
	require.Equal(t, want, snapshot.Entries)
	require.Equal(t, map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue{unreadable: bpfmaps.NewIPCacheValue(98)}, snapshot.Unreadable)
}
