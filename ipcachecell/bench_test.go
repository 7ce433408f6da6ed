// SPDX-License-Identifier: Apache-2.0

package ipcachecell_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

var benchSizes = []int{100_000, 1_000_000}

// randomHostPrefixes returns n distinct random IPv4 /32 prefixes.
func randomHostPrefixes(n int) []netip.Prefix {
	rng := rand.New(rand.NewPCG(42, uint64(n)))
	seen := make(map[uint32]struct{}, n)
	out := make([]netip.Prefix, 0, n)
	for len(out) < n {
		v := rng.Uint32()
		if _, dup := seen[v]; dup {
			continue
		}
		seen[v] = struct{}{}
		addr := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		out = append(out, netip.PrefixFrom(addr, 32))
	}
	return out
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkBaselineEntriesInsert is the floor for BenchmarkUpsertPrefixes:
// writing the same number of rows straight into a table like `ipcache`, in
// transactions of the same size, with nothing else (no metadata, no
// identities, no resolution).
func BenchmarkBaselineEntriesInsert(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			prefixes := randomHostPrefixes(n)
			var perPrefixBytes float64
			for i := range b.N {
				b.StopTimer()
				db := statedb.New()
				entries, err := ipcachecell.NewEntriesTable(db)
				require.NoError(b, err)
				before := heapInUse()
				b.StartTimer()
				for start := 0; start < n; start += 4096 {
					txn := db.WriteTxn(entries)
					for _, p := range prefixes[start:min(start+4096, n)] {
						if _, _, err := entries.Insert(txn, ipcachecell.NewEntry(p, 1<<24, source.Local)); err != nil {
							b.Fatal(err)
						}
					}
					txn.Commit()
				}
				b.StopTimer()
				// Only the first round: later rounds may see the
				// previous round's hive being collected.
				if i == 0 {
					perPrefixBytes = float64(heapInUse()-before) / float64(n)
				}
				runtime.KeepAlive(db)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/prefix")
			b.ReportMetric(perPrefixBytes, "bytes/prefix")
		})
	}
}

// BenchmarkUpsertPrefixes upserts n /32 prefixes through one handle and
// waits until the `ipcache` table holds them all: metadata writes,
// resolution, identity allocation, desired entries. bytes/prefix is the
// heap held afterwards (metadata, identities and ipcache tables), per
// prefix.
func BenchmarkUpsertPrefixes(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			prefixes := randomHostPrefixes(n)
			batch := make([]ipcachecell.PrefixUpsert, n)
			for i, p := range prefixes {
				batch[i] = ipcachecell.PrefixUpsert{Prefix: p}
			}
			var perPrefixBytes float64
			for i := range b.N {
				b.StopTimer()
				var (
					db      *statedb.DB
					ipcache *ipcachecell.IPCache
					entries statedb.Table[*ipcachecell.Entry]
				)
				h := cells.NewHive(identitycell.Cell, ipcachecell.Cell,
					cell.Invoke(func(d *statedb.DB, c *ipcachecell.IPCache, e statedb.Table[*ipcachecell.Entry]) {
						db, ipcache, entries = d, c, e
					}))
				hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
				log := hivetest.Logger(b)
				require.NoError(b, h.Start(log, context.Background()))
				handle, err := ipcache.NewHandle("bench", source.Local)
				require.NoError(b, err)
				before := heapInUse()
				b.StartTimer()

				require.NoError(b, handle.UpsertBatch(batch))
				for {
					txn := db.ReadTxn()
					if entries.NumObjects(txn) == n {
						break
					}
					_, watch := entries.AllWatch(txn)
					<-watch
				}

				b.StopTimer()
				// Only the first round: later rounds may see the
				// previous round's hive being collected.
				if i == 0 {
					perPrefixBytes = float64(heapInUse()-before) / float64(n)
				}
				require.NoError(b, h.Stop(log, context.Background()))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/prefix")
			b.ReportMetric(perPrefixBytes, "bytes/prefix")
		})
	}
}
