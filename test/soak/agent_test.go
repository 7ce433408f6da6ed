// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
)

// agent is the whole control plane (cells.ControlPlane, as the binary runs
// it minus the shell) over a private bpffs mount, state directory and
// policy directory, with handles on what the checks read.
type agent struct {
	t         *testing.T
	hive      *hive.Hive
	log       *slog.Logger
	logs      *logRecorder
	dbStats   *dbStats
	BPFRoot   string
	StateDir  string
	PolicyDir string

	db          *statedb.DB
	ipcache     *ipcachecell.IPCache
	identities  statedb.Table[*identitycell.Identity]
	metadata    statedb.Table[*ipcachecell.PrefixMetadata]
	entries     statedb.Table[*ipcachecell.Entry]
	policies    statedb.Table[*policy.Policy]
	policy      statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]
	health      *cell.SimpleHealth
	restorer    *restorecell.Restorer
	datapath    *datapathcell.Datapath

	// The last computation of the policy table from scratch, for a model
	// and a revision of the identities table.
	bruteForceModel    *model
	bruteForceRevision statedb.Revision
	bruteForceResult   map[policy.Key]string
}

// startAgent starts the agent with the given extra flags. It is stopped,
// and the bpffs unmounted, when the test ends.
func startAgent(t *testing.T, extraFlags ...string) *agent {
	tmp := t.TempDir()
	a := &agent{
		t:         t,
		logs:      newLogRecorder(t, filepath.Join(tmp, "agent.log")),
		dbStats:   newDBStats(),
		BPFRoot:   filepath.Join(tmp, "bpf"),
		StateDir:  filepath.Join(tmp, "state"),
		PolicyDir: filepath.Join(tmp, "policies"),
	}
	require.NoError(t, os.Mkdir(a.PolicyDir, 0o700))
	require.NoError(t, privileged.MountBPFFS(t, a.BPFRoot))
	a.log = slog.New(a.logs)
	a.hive = cells.NewHive(
		cells.ControlPlane,
		// statedb.Cell takes its Metrics if there are any: the graveyard
		// and delete-tracker counts of every table.
		cell.Provide(func() statedb.Metrics { return a.dbStats }),
		cell.Invoke(func(db *statedb.DB, ipc *ipcachecell.IPCache,
			ids statedb.Table[*identitycell.Identity], md statedb.Table[*ipcachecell.PrefixMetadata],
			entries statedb.Table[*ipcachecell.Entry], policies statedb.Table[*policy.Policy],
			pol statedb.Table[*policy.Entry], enforcement statedb.Table[*policy.Enforcement],
			health *cell.SimpleHealth, restorer *restorecell.Restorer, dp *datapathcell.Datapath) {
			a.db, a.ipcache, a.identities, a.metadata, a.entries, a.datapath = db, ipc, ids, md, entries, dp
			a.policies, a.policy, a.enforcement, a.health, a.restorer = policies, pol, enforcement, health, restorer
		}),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	a.hive.RegisterFlags(flags)
	require.NoError(t, flags.Parse(append([]string{
		"--bpf-root=" + a.BPFRoot,
		"--state-dir=" + a.StateDir,
		"--policy-dir=" + a.PolicyDir,
		// Nothing is restored from a fresh bpffs; release at once so
		// that the restore handle is gone before the baseline.
		"--identity-restore-grace-period=0s",
	}, extraFlags...)))

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := a.hive.Stop(a.log, ctx); err != nil {
			t.Errorf("stop agent: %v", err)
		}
		unix.Unmount(a.BPFRoot, unix.MNT_DETACH)
		if t.Failed() {
			a.logs.dumpTail(t, 60)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, a.hive.Start(a.log, ctx))
	return a
}

// waitReady waits until the agent has read its (empty) policy directory,
// initialized its tables and released the (empty) restore.
func (a *agent) waitReady(timeout time.Duration) {
	a.t.Helper()
	a.waitFor(timeout, "agent ready", func() string {
		txn := a.db.ReadTxn()
		for _, table := range []statedb.TableMeta{a.entries, a.policy, a.enforcement, a.policies} {
			if ok, _ := table.Initialized(txn); !ok {
				return fmt.Sprintf("table %s not initialized (pending %v)", table.Name(), table.PendingInitializers(txn))
			}
		}
		if st := a.restorer.Status(); !st.Released {
			return "restore not released: " + st.String()
		}
		return ""
	})
}

// waitFor polls check until it returns "" and fails the test with its last
// answer after timeout.
func (a *agent) waitFor(timeout time.Duration, what string, check func() string) {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	// Back off: some checks are costly, and the agent needs the CPU.
	for interval := 10 * time.Millisecond; ; interval = min(2*interval, 200*time.Millisecond) {
		problem := check()
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: not reached after %s: %s", what, timeout, problem)
		}
		time.Sleep(interval)
	}
}

// tableSizes returns the number of objects of every statedb table.
func (a *agent) tableSizes() map[string]int {
	txn := a.db.ReadTxn()
	sizes := map[string]int{}
	for _, table := range a.db.GetTables(txn) {
		sizes[table.Name()] = table.NumObjects(txn)
	}
	return sizes
}

// degraded returns the health lines (scope: level, message, error) of
// every Degraded scope, as the `health` shell command prints them.
func (a *agent) degraded() []string {
	a.t.Helper()
	st, err := script.NewState(context.Background(), a.t.TempDir(), nil)
	require.NoError(a.t, err)
	_, err = cell.SimpleHealthCmd(a.health).Run(st)
	require.NoError(a.t, err)
	var out strings.Builder
	require.NoError(a.t, st.CloseAndWait(&out))
	var lines []string
	for line := range strings.Lines(out.String()) {
		if strings.Contains(line, "level=Degraded") {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	slices.Sort(lines)
	return lines
}

// heap returns the live heap after garbage collection: HeapAlloc (bytes of
// live objects) and HeapInuse (bytes of spans holding them). Two cycles, so
// that what finalizers freed in the first is gone in the second.
func heap() (alloc, inuse uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.HeapInuse
}

// dbStats is statedb's Metrics: the last graveyard object and delete
// tracker counts of each table.
type dbStats struct {
	mu             sync.Mutex
	graveyard      map[string]int
	deleteTrackers map[string]int
}

func newDBStats() *dbStats {
	return &dbStats{graveyard: map[string]int{}, deleteTrackers: map[string]int{}}
}

func (s *dbStats) GraveyardObjectCount(table string, n int) {
	s.mu.Lock()
	s.graveyard[table] = n
	s.mu.Unlock()
}

func (s *dbStats) DeleteTrackerCount(table string, n int) {
	s.mu.Lock()
	s.deleteTrackers[table] = n
	s.mu.Unlock()
}

// graveyardObjects returns the tables with deleted objects that a change
// iterator has not yet observed (or that the graveyard worker has not yet
// collected), "" if none.
func (s *dbStats) graveyardObjects() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var tables []string
	for table, n := range s.graveyard {
		if n > 0 {
			tables = append(tables, fmt.Sprintf("%s=%d", table, n))
		}
	}
	slices.Sort(tables)
	return strings.Join(tables, " ")
}

func (s *dbStats) trackers() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for table, n := range s.deleteTrackers {
		if n > 0 {
			out[table] = n
		}
	}
	return out
}

func (*dbStats) WriteTxnTableAcquisition(string, string, time.Duration)   {}
func (*dbStats) WriteTxnTotalAcquisition(string, []string, time.Duration) {}
func (*dbStats) WriteTxnDuration(string, []string, time.Duration)         {}
func (*dbStats) GraveyardLowWatermark(string, statedb.Revision)           {}
func (*dbStats) GraveyardCleaningDuration(string, time.Duration)          {}
func (*dbStats) ObjectCount(string, int)                                  {}
func (*dbStats) Revision(string, statedb.Revision)                        {}

var _ statedb.Metrics = (*dbStats)(nil)

// logRecorder writes the agent's log to a file (not to t.Log, which keeps
// everything in memory and would look like a leak) and counts the records
// at warning level and above by message.
type logRecorder struct {
	path    string
	handler slog.Handler
	counts  *logCounts
}

type logCounts struct {
	mu     sync.Mutex
	byMsg  map[string]int // "LEVEL msg"
	errors []string       // the first error records, in full
}

func newLogRecorder(t *testing.T, path string) *logRecorder {
	f, err := os.Create(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return &logRecorder{
		path:    path,
		handler: slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo}),
		counts:  &logCounts{byMsg: map[string]int{}},
	}
}

func (l *logRecorder) Enabled(ctx context.Context, level slog.Level) bool {
	return l.handler.Enabled(ctx, level)
}

func (l *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		l.counts.mu.Lock()
		l.counts.byMsg[r.Level.String()+" "+r.Message]++
		if r.Level >= slog.LevelError && len(l.counts.errors) < 10 {
			var b strings.Builder
			b.WriteString(r.Message)
			r.Attrs(func(attr slog.Attr) bool {
				fmt.Fprintf(&b, " %s", attr)
				return true
			})
			l.counts.errors = append(l.counts.errors, b.String())
		}
		l.counts.mu.Unlock()
	}
	return l.handler.Handle(ctx, r)
}

func (l *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{path: l.path, handler: l.handler.WithAttrs(attrs), counts: l.counts}
}

func (l *logRecorder) WithGroup(name string) slog.Handler {
	return &logRecorder{path: l.path, handler: l.handler.WithGroup(name), counts: l.counts}
}

// warnings returns the counts of warning and error records by message.
func (l *logRecorder) warnings() map[string]int {
	l.counts.mu.Lock()
	defer l.counts.mu.Unlock()
	out := map[string]int{}
	for msg, n := range l.counts.byMsg {
		out[msg] = n
	}
	return out
}

func (l *logRecorder) errorRecords() []string {
	l.counts.mu.Lock()
	defer l.counts.mu.Unlock()
	return slices.Clone(l.counts.errors)
}

// dumpTail logs the last lines of the agent's log, for a failed test.
func (l *logRecorder) dumpTail(t *testing.T, n int) {
	f, err := os.Open(l.path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		if lines = append(lines, scanner.Text()); len(lines) > n {
			lines = lines[1:]
		}
	}
	t.Logf("last %d lines of the agent's log (%s):\n%s", len(lines), l.path, strings.Join(lines, "\n"))
}
