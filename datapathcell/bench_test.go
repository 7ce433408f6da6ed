// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

const benchEntries = 100_000

func benchPrefixes(n int) []netip.Prefix {
	rng := rand.New(rand.NewPCG(1, 1))
	seen := map[uint32]bool{}
	out := make([]netip.Prefix, 0, n)
	for len(out) < n {
		v := rng.Uint32()
		if seen[v] {
			continue
		}
		seen[v] = true
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 32))
	}
	return out
}

// BenchmarkRawBatchUpdate is the floor for BenchmarkReconcilerThroughput:
// the same entries written with one BatchUpdate into a fresh ipcache map.
func BenchmarkRawBatchUpdate(b *testing.B) {
	privileged.Test(b)
	prefixes := benchPrefixes(benchEntries)
	keys := make([]bpfmaps.IPCacheKey, len(prefixes))
	values := make([]bpfmaps.IPCacheValue, len(prefixes))
	for i, p := range prefixes {
		keys[i], values[i] = bpfmaps.NewIPCacheKey(p), bpfmaps.NewIPCacheValue(16777217)
	}
	for range b.N {
		b.StopTimer()
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 24, ValueSize: 24, MaxEntries: benchEntries, Flags: 1})
		require.NoError(b, err)
		b.StartTimer()
		n, err := m.BatchUpdate(keys, values, nil)
		require.NoError(b, err)
		require.Equal(b, benchEntries, n)
		b.StopTimer()
		m.Close()
	}
	b.ReportMetric(float64(b.N*benchEntries)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkReconcilerThroughput inserts rows into the desired `ipcache`
// table (as the resolver does, in transactions of 4096) and waits until the
// reconciler has written all of them into the pinned map.
func BenchmarkReconcilerThroughput(b *testing.B) {
	privileged.Test(b)
	prefixes := benchPrefixes(benchEntries)
	for range b.N {
		b.StopTimer()
		bpfRoot := filepath.Join(b.TempDir(), "bpf")
		var (
			db      *statedb.DB
			entries ipcachecell.ReconcilerTable
			dp      *datapathcell.Datapath
		)
		h := cells.NewHive(identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell,
			cell.Invoke(func(d *statedb.DB, t ipcachecell.ReconcilerTable, p *datapathcell.Datapath) {
				db, entries, dp = d, t, p
			}))
		hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
		hive.AddConfigOverride(h, func(c *datapathcell.Config) {
			c.BPFRoot = bpfRoot
			c.IPCacheMapMaxEntries = benchEntries
		})
		log := hivetest.Logger(b)
		require.NoError(b, h.Start(log, context.Background()))
		b.StartTimer()

		for start := 0; start < len(prefixes); start += 4096 {
			txn := db.WriteTxn(entries)
			for _, p := range prefixes[start:min(start+4096, len(prefixes))] {
				entry := ipcachecell.NewEntry(p, 16777217, source.Local)
				entry.Explicit = true
				_, _, err := entries.Insert(txn, entry)
				require.NoError(b, err)
			}
			txn.Commit()
		}
		// The writer goes in revision order: once the last row is
		// done, all are.
		last := prefixes[len(prefixes)-1]
		for {
			_, rev, _ := entries.Get(db.ReadTxn(), ipcachecell.EntryIndex.Query(last))
			if kind, _ := dp.IPCacheStatus(rev); kind == reconciler.StatusKindDone {
				break
			}
			time.Sleep(time.Millisecond)
		}

		b.StopTimer()
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, "ipcache-agent", "ipcache"), nil)
		require.NoError(b, err)
		require.Equal(b, benchEntries, countEntries(m), "every entry in the map")
		m.Close()
		require.NoError(b, h.Stop(log, context.Background()))
		unix.Unmount(bpfRoot, unix.MNT_DETACH)
	}
	b.ReportMetric(float64(b.N*benchEntries)/b.Elapsed().Seconds(), "entries/s")
}

func countEntries(m *ebpf.Map) int {
	var (
		k bpfmaps.IPCacheKey
		n int
	)
	for {
		var next bpfmaps.IPCacheKey
		var err error
		if n == 0 {
			err = m.NextKey(nil, &next)
		} else {
			err = m.NextKey(&k, &next)
		}
		if err != nil {
			return n
		}
		k = next
		n++
	}
}
