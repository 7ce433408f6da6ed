// SPDX-License-Identifier: Apache-2.0

package restorecell_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

const restartPrefixes = 100_000

type benchAgent struct {
	hive     *hive.Hive
	db       *statedb.DB
	ipcache  *ipcachecell.IPCache
	entries  statedb.Table[*ipcachecell.Entry]
	datapath *datapathcell.Datapath
	restorer *restorecell.Restorer
}

func startBenchAgent(b *testing.B, bpfRoot, stateDir string) *benchAgent {
	a := &benchAgent{}
	a.hive = cells.NewHive(identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell, restorecell.Cell,
		cell.Invoke(func(db *statedb.DB, c *ipcachecell.IPCache, e statedb.Table[*ipcachecell.Entry], d *datapathcell.Datapath,
			r *restorecell.Restorer) {
			a.db, a.ipcache, a.entries, a.datapath, a.restorer = db, c, e, d, r
		}))
	hive.AddConfigOverride(a.hive, func(c *statedir.Config) { c.StateDir = stateDir })
	hive.AddConfigOverride(a.hive, func(c *datapathcell.Config) { c.BPFRoot = bpfRoot })
	hive.AddConfigOverride(a.hive, func(c *restorecell.Config) { c.IdentityRestoreGracePeriod = time.Hour })
	require.NoError(b, a.hive.Populate(hivetest.Logger(b)))
	require.NoError(b, a.hive.Start(hivetest.Logger(b), context.Background()))
	return a
}

// waitRestored waits until restore has restored n prefixes (it does so in
// its start hook: this returns at once after the start).
func (a *benchAgent) waitRestored(n int) {
	for a.restorer.Status().Restored < n {
		time.Sleep(time.Millisecond)
	}
}

// waitWritten waits until the ipcache map's reconciler has handled n keys
// (written or skipped as unchanged).
func (a *benchAgent) waitReconciled(n uint64) {
	for {
		written, unchanged := a.datapath.MapWrites(bpfmaps.IPCacheName)
		if written+unchanged >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkRestart restores 100k prefixes: the first agent upserts them and
// waits until they are in the pinned map; the measured part is the second
// agent's start (restore runs in a start hook), then until the `ipcache`
// table is initialized and every entry is reconciled. It reports the times
// and how many map writes the restart caused (map-writes) against those it
// skipped because the pinned map already held the value.
func BenchmarkRestart(b *testing.B) {
	privileged.Test(b)
	for range b.N {
		b.StopTimer()
		bpfRoot := filepath.Join(b.TempDir(), "bpf")
		stateDir := b.TempDir()
		first := startBenchAgent(b, bpfRoot, stateDir)
		h, err := first.ipcache.NewHandle("owner", source.Local)
		require.NoError(b, err)
		batch := make([]ipcachecell.PrefixUpsert, restartPrefixes)
		for i := range batch {
			addr := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
			batch[i] = ipcachecell.PrefixUpsert{Prefix: netip.PrefixFrom(addr, 32)}
		}
		require.NoError(b, h.UpsertBatch(batch))
		first.waitReconciled(restartPrefixes)
		require.NoError(b, first.hive.Stop(hivetest.Logger(b), context.Background()))

		b.StartTimer()
		begin := time.Now()
		second := startBenchAgent(b, bpfRoot, stateDir)
		second.waitRestored(restartPrefixes)
		toRestored := time.Since(begin)
		_, initialized := second.entries.Initialized(second.db.ReadTxn())
		<-initialized
		toInitialized := time.Since(begin)
		second.waitReconciled(restartPrefixes)
		toReconciled := time.Since(begin)
		b.StopTimer()

		written, unchanged := second.datapath.MapWrites(bpfmaps.IPCacheName)
		pinned, err := bpfmaps.ReadIPCache(bpfRoot)
		require.NoError(b, err)
		require.Len(b, pinned, restartPrefixes)
		b.ReportMetric(float64(toRestored.Milliseconds()), "ms-start-to-restored")
		b.ReportMetric(float64(toInitialized.Milliseconds()), "ms-to-ipcache-initialized")
		b.ReportMetric(float64(toReconciled.Milliseconds()), "ms-to-reconciled")
		b.ReportMetric(float64(written), "map-writes")
		b.ReportMetric(float64(unchanged), "unchanged-skipped")
		require.NoError(b, second.hive.Stop(hivetest.Logger(b), context.Background()))
		unix.Unmount(bpfRoot, unix.MNT_DETACH)
	}
}
