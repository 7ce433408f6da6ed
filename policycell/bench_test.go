// SPDX-License-Identifier: Apache-2.0

package policycell_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// heapInUse returns the live heap. It collects twice: statedb's change
// iterators free their delete trackers (and through them a stopped hive's
// whole database) in cleanups that run only after a first collection.
func heapInUse() int64 {
	runtime.GC()
	time.Sleep(10 * time.Millisecond) // let the cleanups run
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// writePolicyFiles writes one file per policy, each with one egress rule
// of cidrsPerPolicy distinct /24s (distinct across policies too) and one
// port. Every CIDR gets its own identity, and one entry.
func writePolicyFiles(tb testing.TB, dir string, policies, cidrsPerPolicy int) {
	tb.Helper()
	for i := range policies {
		var cidrs []string
		for j := range cidrsPerPolicy {
			n := i*cidrsPerPolicy + j
			cidrs = append(cidrs, fmt.Sprintf("%d.%d.%d.0/24", 10+n>>16, n>>8&0xff, n&0xff))
		}
		content := fmt.Sprintf("name: policy-%d\negress:\n  - toCIDR: [%s]\n    toPorts: [{port: 443, protocol: TCP}]\n",
			i, strings.Join(cidrs, ", "))
		require.NoError(tb, os.WriteFile(filepath.Join(dir, fmt.Sprintf("policy-%d.yaml", i)), []byte(content), 0o644))
	}
}

// BenchmarkDirectoryToPolicyTable measures the time from starting a hive
// of the identity, ipcache and policy cells on a directory of 1,000
// policies of 100 CIDRs each to a complete desired `policy` table (marked
// initialized: the directory was read and applied, the ipcache resolved
// every CIDR to an identity, and the selectors processed them). That is
// parsing, 100,000 prefixes through the handles, their resolution and
// identity allocation, and 100,000 entries. heap-bytes is the heap in use
// afterwards (all of those tables), and bytes/cidr that per CIDR;
// cpu-ns/op the process's CPU time (user and system, every goroutine) in
// the timed part, which a machine shared with other work disturbs less
// than the time.
func BenchmarkDirectoryToPolicyTable(b *testing.B) {
	benchmarkToPolicyTable(b, 1_000, 100)
}

// BenchmarkOneFileToPolicyTable is BenchmarkDirectoryToPolicyTable with
// the 100,000 CIDRs in one policy of one file, as bench-peer writes them.
func BenchmarkOneFileToPolicyTable(b *testing.B) {
	benchmarkToPolicyTable(b, 1, 100_000)
}

// BenchmarkTenFilesToPolicyTable is the same 100,000 CIDRs in ten
// policies of ten files, the shape of bench-peer's directory at 1M scaled
// down ten times: one round adds policies that are each a tenth of it.
func BenchmarkTenFilesToPolicyTable(b *testing.B) {
	benchmarkToPolicyTable(b, 10, 10_000)
}

func benchmarkToPolicyTable(b *testing.B, policies, cidrsPerPolicy int) {
	dir := b.TempDir()
	writePolicyFiles(b, dir, policies, cidrsPerPolicy)
	log := slog.New(slog.DiscardHandler)

	var (
		heapBytes int64
		cpu       time.Duration
	)
	for i := range b.N {
		b.StopTimer()
		var (
			db      *statedb.DB
			entries statedb.Table[*policy.Entry]
		)
		before := heapInUse()
		h := cells.NewHive(identitycell.Cell, ipcachecell.Cell, policycell.Cell,
			// A policy map that holds the entries (without it, the table
			// would stop at twice the default map, and a file over the
			// default map would be rejected).
			cell.Provide(func() policy.MapCapacity { return policy.MapCapacity(policies * cidrsPerPolicy) }),
			cell.Invoke(func(d *statedb.DB, e statedb.Table[*policy.Entry]) { db, entries = d, e }))
		hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
		hive.AddConfigOverride(h, func(c *policycell.Config) { c.PolicyDir = dir })
		require.NoError(b, h.Populate(log))
		start := processCPU(b)
		b.StartTimer()

		require.NoError(b, h.Start(log, context.Background()))
		for {
			initialized, watch := entries.Initialized(db.ReadTxn())
			if initialized {
				break
			}
			<-watch
		}

		b.StopTimer()
		cpu += processCPU(b) - start
		require.Equal(b, policies*cidrsPerPolicy, entries.NumObjects(db.ReadTxn()))
		if i == 0 {
			heapBytes = heapInUse() - before
		}
		require.NoError(b, h.Stop(log, context.Background()))
	}
	b.ReportMetric(float64(heapBytes), "heap-bytes")
	b.ReportMetric(float64(heapBytes)/float64(policies*cidrsPerPolicy), "bytes/cidr")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU returns the CPU time the process used so far, user and
// system.
func processCPU(tb testing.TB) time.Duration {
	var usage syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &usage))
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}
