// SPDX-License-Identifier: Apache-2.0

package ipcachecell_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

const (
	// Messages of the resolver that the test looks for.
	failureLog  = "Cannot resolve prefixes, keeping their previous entries and retrying"
	recoveryLog = "All prefixes resolved after earlier failures"
	// resolveHealth is the health scope of the resolver job.
	resolveHealth = "ipcache.job-resolve"
)

// exhaustion is the identity and ipcache cells (as cells.NewHive builds
// them) with a small local identity space, and what the test observes:
// the tables, the resolver's health, its log records, and the times of its
// write transactions.
type exhaustion struct {
	t          *testing.T
	db         *statedb.DB
	ipcache    *ipcachecell.IPCache
	metadata   statedb.Table[*ipcachecell.PrefixMetadata]
	entries    statedb.Table[*ipcachecell.Entry]
	identities statedb.Table[*identitycell.Identity]
	health     *cell.SimpleHealth
	logs       *recordedLogs
	rounds     *resolverRounds
}

func startExhaustion(t *testing.T, spaceSize int) *exhaustion {
	x := &exhaustion{t: t, logs: &recordedLogs{}, rounds: &resolverRounds{}}
	h := cells.NewHive(
		identitycell.Cell,
		ipcachecell.Cell,
		cell.Provide(func() statedb.Metrics { return x.rounds }),
		cell.Invoke(func(db *statedb.DB, ipc *ipcachecell.IPCache, md statedb.Table[*ipcachecell.PrefixMetadata],
			entries statedb.Table[*ipcachecell.Entry], ids statedb.Table[*identitycell.Identity], health *cell.SimpleHealth) {
			x.db, x.ipcache, x.metadata, x.entries, x.identities, x.health = db, ipc, md, entries, ids, health
		}),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse([]string{
		"--state-dir=" + t.TempDir(),
		fmt.Sprintf("--identity-local-space-size=%d", spaceSize),
	}))
	log := slog.New(x.logs)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	return x
}

// resolved returns the `ipcache` table as prefix -> identity.
func (x *exhaustion) resolved() map[netip.Prefix]identity.Number {
	out := map[netip.Prefix]identity.Number{}
	for e := range x.entries.All(x.db.ReadTxn()) {
		out[e.Prefix()] = e.Identity
	}
	return out
}

// waiting returns the prefixes that have metadata but no entry.
func (x *exhaustion) waiting() map[netip.Prefix]struct{} {
	txn := x.db.ReadTxn()
	out := map[netip.Prefix]struct{}{}
	for row := range x.metadata.All(txn) {
		if _, _, found := x.entries.Get(txn, ipcachecell.EntryIndex.Query(row.Prefix())); !found {
			out[row.Prefix()] = struct{}{}
		}
	}
	return out
}

// checkResolved checks the entries against the identities: distinct local
// numbers within the space, one reference each, labels that name the
// prefix.
func (x *exhaustion) checkResolved(spaceSize int) {
	x.t.Helper()
	txn := x.db.ReadTxn()
	seen := map[identity.Number]netip.Prefix{}
	last := identity.MinLocal + identity.Number(spaceSize) - 1
	for e := range x.entries.All(txn) {
		if e.Explicit || e.Identity < identity.MinLocal || e.Identity > last {
			x.t.Fatalf("%s maps to %d (explicit %t), outside the local space", e.Prefix(), e.Identity, e.Explicit)
		}
		if other, dup := seen[e.Identity]; dup {
			x.t.Fatalf("%s and %s share identity %d", e.Prefix(), other, e.Identity)
		}
		seen[e.Identity] = e.Prefix()
		id, _, found := x.identities.Get(txn, identitycell.IdentityIndex.Query(e.Identity))
		if !found || id.References() != 1 || id.Labels.String() != "cidr:"+e.Prefix().String() {
			x.t.Fatalf("%s maps to %d: allocated %t, identity %+v", e.Prefix(), e.Identity, found, id)
		}
	}
	require.Equal(x.t, len(seen), x.identities.NumObjects(txn), "identities that no entry holds")
}

// waitFor polls check until it returns "" and fails with its last answer
// after timeout.
func (x *exhaustion) waitFor(timeout time.Duration, check func() string) {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		problem := check()
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("not reached after %s: %s", timeout, problem)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// healthOf returns the resolver's health. Before the resolver first
// reports, its scope does not exist: the status then says so (and waits
// on it go on waiting).
func (x *exhaustion) healthOf() (cell.Level, string, string) {
	h := x.health.GetChild(resolveHealth)
	if h == nil {
		return "", "no health scope " + resolveHealth + " yet", ""
	}
	h.Lock()
	defer h.Unlock()
	errText := ""
	if h.Error != nil {
		errText = h.Error.Error()
	}
	return h.Level, h.Status, errText
}

// TestIdentityExhaustionAtScale: 5,000 prefixes from two owners (a third
// of them shared) against a local identity space of 2,000. Exactly the
// prefixes that get no identity are reported (health, one log line per new
// failure) and retried with backoff (100 ms doubling to 10 s), while the
// others stay resolved to distinct numbers that never change. When owners
// remove prefixes, the freed numbers go to waiting prefixes at the next
// retry; when everything fits, health is OK again.
//
// It runs in real time, not in a synctest bubble: the agent's jobs do not
// close their statedb change iterators, whose cleanup then runs outside the
// bubble and crashes the test binary.
func TestIdentityExhaustionAtScale(t *testing.T) {
	const (
		space       = 2000
		numPrefixes = 5000
		batchSize   = 250
		// retryWait bounds the wait for a retry: the longest backoff,
		// and slack for a loaded machine and the race detector.
		retryWait = 10*time.Second + 5*time.Second
	)
	x := startExhaustion(t, space)

	// Prefix i is owned by pods if i%3 != 2 and by policy/b if i%3 != 0:
	// a third of the prefixes have both owners.
	prefixes := make([]netip.Prefix, numPrefixes)
	for i := range prefixes {
		if i%2 == 0 {
			prefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
		} else {
			prefixes[i] = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}), 128)
		}
	}
	pods, err := x.ipcache.NewHandle("pods", source.Kubernetes)
	require.NoError(t, err)
	policy, err := x.ipcache.NewHandle("policy/b", source.Directory)
	require.NoError(t, err)
	owned := map[*ipcachecell.Handle]map[netip.Prefix]bool{pods: {}, policy: {}}
	for i, p := range prefixes {
		if i%3 != 2 {
			owned[pods][p] = true
		}
		if i%3 != 0 {
			owned[policy][p] = true
		}
	}
	numRows := func() int { return len(owned[pods]) + len(owned[policy]) }

	// Both owners upsert in batches, concurrently.
	began := time.Now()
	var wg sync.WaitGroup
	for _, h := range []*ipcachecell.Handle{pods, policy} {
		mine := slices.SortedFunc(maps.Keys(owned[h]), prefixkey.Compare)
		wg.Go(func() {
			for start := 0; start < len(mine); start += batchSize {
				var batch []ipcachecell.PrefixUpsert
				for _, p := range mine[start:min(start+batchSize, len(mine))] {
					batch = append(batch, ipcachecell.PrefixUpsert{Prefix: p})
				}
				assert.NoError(t, h.UpsertBatch(batch))
			}
		})
	}
	wg.Wait()
	wantStatus := fmt.Sprintf("%d prefixes cannot be resolved, retrying", numPrefixes-space)
	x.waitFor(time.Minute, func() string {
		if n := x.metadata.NumObjects(x.db.ReadTxn()); n != numRows() {
			return fmt.Sprintf("%d metadata rows", n)
		}
		if _, status, _ := x.healthOf(); status != wantStatus {
			return "health: " + status
		}
		return ""
	})
	t.Logf("%d prefixes (%d metadata rows) from 2 owners resolved against a space of %d in %s",
		numPrefixes, numRows(), space, time.Since(began).Round(time.Millisecond))

	// Exactly the prefixes without identity are reported.
	x.checkResolved(space)
	before := x.resolved()
	waiting := x.waiting()
	require.Len(t, before, space, "entries")
	require.Len(t, waiting, numPrefixes-space, "prefixes without identity")
	level, status, errText := x.healthOf()
	require.Equal(t, cell.StatusDegraded, level)
	require.Equal(t, wantStatus, status)
	require.Contains(t, errText, identitycell.ErrExhausted.Error())
	failures := x.logs.find(failureLog)
	require.NotEmpty(t, failures, "no log line for the failures")
	newFailures := 0
	for _, r := range failures {
		require.Equal(t, slog.LevelWarn, r.level)
		newFailures += int(r.attrs["new-failures"].(int64))
		require.Contains(t, fmt.Sprint(r.attrs["error"]), identitycell.ErrExhausted.Error())
		for _, p := range r.attrs["examples"].([]netip.Prefix) {
			_, isWaiting := waiting[p]
			require.True(t, isWaiting, "logged example %s has an identity", p)
		}
	}
	require.Equal(t, numPrefixes-space, newFailures, "each failing prefix logged once as a new failure")
	require.EqualValues(t, numPrefixes-space, failures[len(failures)-1].attrs["failing"])

	// Retries with backoff. Nothing changes meanwhile: not the entries,
	// not a single write to the ipcache or identities tables, not the
	// health, and no further log lines.
	txn := x.db.ReadTxn()
	entriesRev, identitiesRev := x.entries.Revision(txn), x.identities.Revision(txn)
	x.rounds.reset()
	// The backoff doubles from 100 ms to 10 s: within retryWait one
	// backoff of 800 ms or more comes, and at most a few shorter ones
	// before it (100, 200 and 400 ms, fewer if the retries had gone on a
	// while before the reset). Retrying at a constant 100 ms would make a
	// round every 100 ms and no gap that long; not at all, one round.
	// Lower bounds only: a timer never fires early, but a loaded machine
	// (the race detector, other tests) makes it late, by seconds at
	// times, and spreads one round's chunks apart (see backoffs).
	const longBackoff = 800*time.Millisecond - 10*time.Millisecond
	x.waitFor(retryWait, func() string {
		if !slices.ContainsFunc(x.rounds.backoffs(), func(b time.Duration) bool { return b >= longBackoff }) {
			return fmt.Sprintf("backoffs %v", x.rounds.backoffs())
		}
		return ""
	})
	backoffs := x.rounds.backoffs()
	t.Logf("retries of %d prefixes: backoff before each retry (time between rounds minus the round's own time) %v",
		numPrefixes-space, backoffs)
	shorter := slices.IndexFunc(backoffs, func(b time.Duration) bool { return b >= longBackoff })
	require.LessOrEqual(t, shorter, 5, "backoffs %v: retries do not back off", backoffs)
	for k, b := range backoffs {
		require.Less(t, b, retryWait, "backoff %d of %v", k, backoffs)
	}
	txn = x.db.ReadTxn()
	require.Equal(t, entriesRev, x.entries.Revision(txn), "ipcache table written during the retries")
	require.Equal(t, identitiesRev, x.identities.Revision(txn), "identities table written during the retries")
	require.Equal(t, before, x.resolved())
	_, status, _ = x.healthOf()
	require.Equal(t, wantStatus, status)
	require.Len(t, x.logs.find(failureLog), len(failures), "the same failures logged again")

	// A third owner adds a label to 50 resolved prefixes: they need new
	// identities, which cannot be had, so they keep their entries and
	// numbers, and are reported (and logged) as failing, with the others.
	labeller, err := x.ipcache.NewHandle("labeller", source.Local)
	require.NoError(t, err)
	relabelled := slices.SortedFunc(maps.Keys(before), prefixkey.Compare)[:50]
	appX, err := labels.New("app:x")
	require.NoError(t, err)
	var relabel []ipcachecell.PrefixUpsert
	for _, p := range relabelled {
		relabel = append(relabel, ipcachecell.PrefixUpsert{Prefix: p, Metadata: ipcachecell.Metadata{Labels: appX}})
	}
	require.NoError(t, labeller.UpsertBatch(relabel))
	wantStatus = fmt.Sprintf("%d prefixes cannot be resolved, retrying", numPrefixes-space+len(relabelled))
	x.waitFor(retryWait, func() string {
		if _, status, _ := x.healthOf(); status != wantStatus {
			return "health: " + status
		}
		return ""
	})
	require.Equal(t, before, x.resolved(), "relabelled prefixes keep their previous entries")
	x.checkResolved(space)
	last := x.logs.find(failureLog)
	require.Len(t, last, len(failures)+1)
	require.EqualValues(t, len(relabelled), last[len(last)-1].attrs["new-failures"])
	for _, p := range last[len(last)-1].attrs["examples"].([]netip.Prefix) {
		require.True(t, slices.Contains(relabelled, p), "logged example %s was not relabelled", p)
	}
	// The label goes: they resolve to the entries they kept.
	require.NoError(t, labeller.Release())
	wantStatus = fmt.Sprintf("%d prefixes cannot be resolved, retrying", numPrefixes-space)
	x.waitFor(retryWait, func() string {
		if _, status, _ := x.healthOf(); status != wantStatus {
			return "health: " + status
		}
		return ""
	})
	require.Equal(t, before, x.resolved())
	txn = x.db.ReadTxn()
	require.Equal(t, entriesRev, x.entries.Revision(txn), "ipcache table written for the relabelled prefixes")
	require.Equal(t, identitiesRev, x.identities.Revision(txn), "identities table written for the relabelled prefixes")

	// Owners remove prefixes: 600 resolved prefixes that have one owner,
	// by that owner (600 numbers free up), policy/b 300 shared resolved ones
	// (pods still has them: nothing frees), and both 200 shared waiting ones
	// (they stop waiting without an identity). Which prefixes resolved
	// depends on which owner's batches came first, so the sole owners' are
	// taken together: about two thirds of the resolved ones, whatever the
	// order.
	soleResolved := map[*ipcachecell.Handle][]netip.Prefix{}
	var numSoleResolved int
	var sharedResolved, sharedWaiting []netip.Prefix
	for i, p := range prefixes {
		_, resolved := before[p]
		switch {
		case i%3 != 1 && resolved && numSoleResolved < 600:
			owner := pods
			if i%3 == 2 {
				owner = policy
			}
			soleResolved[owner] = append(soleResolved[owner], p)
			numSoleResolved++
		case i%3 == 1 && resolved:
			sharedResolved = append(sharedResolved, p)
		case i%3 == 1 && !resolved:
			sharedWaiting = append(sharedWaiting, p)
		}
	}
	require.Equal(t, 600, numSoleResolved)
	require.GreaterOrEqual(t, len(sharedResolved), 300)
	require.GreaterOrEqual(t, len(sharedWaiting), 200)
	removed := map[netip.Prefix]bool{}
	remove := func(h *ipcachecell.Handle, ps []netip.Prefix) {
		require.NoError(t, h.RemoveBatch(ps))
		for _, p := range ps {
			delete(owned[h], p)
			if !owned[pods][p] && !owned[policy][p] {
				removed[p] = true
			}
		}
	}
	remove(pods, soleResolved[pods])
	remove(policy, soleResolved[policy])
	remove(policy, sharedResolved[:300])
	remove(pods, sharedWaiting[:200])
	remove(policy, sharedWaiting[:200])
	removedAt := time.Now()

	// The freed numbers go to waiting prefixes at the next retry, at most
	// the longest backoff later.
	stillWaiting := numPrefixes - space - 200 - 600
	wantStatus = fmt.Sprintf("%d prefixes cannot be resolved, retrying", stillWaiting)
	x.waitFor(retryWait, func() string {
		if n := x.entries.NumObjects(x.db.ReadTxn()); n != space {
			return fmt.Sprintf("%d entries", n)
		}
		if _, status, _ := x.healthOf(); status != wantStatus {
			return "health: " + status
		}
		return ""
	})
	t.Logf("600 numbers freed: waiting prefixes took them %s later", time.Since(removedAt).Round(time.Millisecond))
	x.checkResolved(space)
	after := x.resolved()
	for p, id := range before {
		if !removed[p] && after[p] != id {
			t.Fatalf("identity of %s changed from %d to %d while others were retried", p, id, after[p])
		}
	}
	waitingNow := x.waiting()
	require.Len(t, waitingNow, stillWaiting)
	for p := range waitingNow {
		if _, wasWaiting := waiting[p]; !wasWaiting {
			t.Fatalf("%s lost its identity", p)
		}
	}

	// Everything fits: pods releases its handle, policy/b keeps 1,500.
	require.NoError(t, pods.Release())
	clear(owned[pods])
	keep := slices.SortedFunc(maps.Keys(owned[policy]), prefixkey.Compare)
	remove(policy, keep[1500:])
	removedAt = time.Now()
	x.waitFor(retryWait, func() string {
		if level, status, _ := x.healthOf(); level != cell.StatusOK {
			return "health: " + status
		}
		return ""
	})
	t.Logf("everything fits: all resolved %s later", time.Since(removedAt).Round(time.Millisecond))
	x.checkResolved(space)
	final := x.resolved()
	require.Len(t, final, 1500)
	require.Empty(t, x.waiting())
	for p := range owned[policy] {
		if id, ok := after[p]; ok && final[p] != id {
			t.Fatalf("identity of %s changed from %d to %d", p, id, final[p])
		}
	}
	_, status, _ = x.healthOf()
	require.Equal(t, "1500 prefixes resolved", status)
	require.Len(t, x.logs.find(recoveryLog), 1)
}

// TestIdentityExhaustionRetryNotStarvedByOtherChanges: prefixes that wait
// for an identity get one at the next retry once numbers free up, even
// while another owner keeps changing unrelated metadata (the resolver once
// re-armed its retry timer on every change, postponing the retry forever).
func TestIdentityExhaustionRetryNotStarvedByOtherChanges(t *testing.T) {
	const space = 100
	x := startExhaustion(t, space)
	owner, err := x.ipcache.NewHandle("pods", source.Kubernetes)
	require.NoError(t, err)
	var batch []ipcachecell.PrefixUpsert
	for i := range 150 {
		batch = append(batch, ipcachecell.PrefixUpsert{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32)})
	}
	require.NoError(t, owner.UpsertBatch(batch))
	x.waitFor(10*time.Second, func() string {
		if _, status, _ := x.healthOf(); status != "50 prefixes cannot be resolved, retrying" {
			return status
		}
		return ""
	})

	// Another owner changes the metadata of a prefix with an explicit
	// identity (it needs no number) every 50 ms, as pods come and go.
	other, err := x.ipcache.NewHandle("other", source.Local)
	require.NoError(t, err)
	churn := func(d time.Duration) {
		for i := 0; d > 0; i++ {
			require.NoError(t, other.Upsert(netip.MustParsePrefix("192.0.2.1/32"),
				ipcachecell.Metadata{ExplicitIdentity: identity.Number(1000 + i%2)}))
			time.Sleep(50 * time.Millisecond)
			d -= 50 * time.Millisecond
		}
	}
	churn(time.Second)

	// Room for 10 of the 50 waiting prefixes.
	var gone []netip.Prefix
	for _, u := range batch[:10] {
		gone = append(gone, u.Prefix)
	}
	require.NoError(t, owner.RemoveBatch(gone))
	churn(3 * time.Second)
	require.Equal(t, space+1, x.entries.NumObjects(x.db.ReadTxn()),
		"3 s after numbers were freed, with an unrelated change every 50 ms: the freed numbers should be taken "+
			"by waiting prefixes (the backoff was 100 ms)")
}

// resolverRounds is statedb's Metrics, recording when the resolver
// committed a write transaction of the identities and ipcache tables (one
// per round that resolved anything, a retry included) and how long it
// held it.
type resolverRounds struct {
	mu     sync.Mutex
	rounds []round
}

type round struct {
	committed time.Time
	held      time.Duration
}

func (r *resolverRounds) WriteTxnDuration(handle string, tables []string, held time.Duration) {
	// The resolver writes through the allocator, whose database handle
	// is the identity module's.
	if handle == "identity" && slices.Equal(tables, []string{identitycell.IdentitiesTableName, ipcachecell.EntriesTableName}) {
		r.mu.Lock()
		r.rounds = append(r.rounds, round{time.Now(), held})
		r.mu.Unlock()
	}
}

func (r *resolverRounds) reset() {
	r.mu.Lock()
	r.rounds = nil
	r.mu.Unlock()
}

func (r *resolverRounds) get() []round {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rounds)
}

// backoffs returns the time the resolver waited before each round after
// the first: the time since the previous commit less the round's own
// transaction, rounded to 10 ms. A round may write in several
// transactions (chunks) back to back: a gap shorter than minBackoffGap,
// less than the shortest backoff, is the same round. On a loaded machine
// two chunks of a round can be further apart than that (under the race
// detector: docs/SCALE.md, "The resolver reads a chunk while the one
// before it is written"): such a gap shows as a short backoff.
func (r *resolverRounds) backoffs() []time.Duration {
	const minBackoffGap = 90 * time.Millisecond
	rounds := r.get()
	var out []time.Duration
	for i := 1; i < len(rounds); i++ {
		if gap := rounds[i].committed.Sub(rounds[i-1].committed) - rounds[i].held; gap >= minBackoffGap {
			out = append(out, gap.Round(10*time.Millisecond))
		}
	}
	return out
}

func (*resolverRounds) WriteTxnTableAcquisition(string, string, time.Duration)   {}
func (*resolverRounds) WriteTxnTotalAcquisition(string, []string, time.Duration) {}
func (*resolverRounds) GraveyardLowWatermark(string, statedb.Revision)           {}
func (*resolverRounds) GraveyardCleaningDuration(string, time.Duration)          {}
func (*resolverRounds) GraveyardObjectCount(string, int)                         {}
func (*resolverRounds) ObjectCount(string, int)                                  {}
func (*resolverRounds) DeleteTrackerCount(string, int)                           {}
func (*resolverRounds) Revision(string, statedb.Revision)                        {}

var _ statedb.Metrics = (*resolverRounds)(nil)

// recordedLogs is a slog.Handler that keeps the records at info and above.
type recordedLogs struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

func (l *recordedLogs) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelInfo
}

func (l *recordedLogs) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	l.mu.Lock()
	l.records = append(l.records, rec)
	l.mu.Unlock()
	return nil
}

func (l *recordedLogs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recordedLogs) WithGroup(string) slog.Handler      { return l }

// find returns the records with the message.
func (l *recordedLogs) find(msg string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.records {
		if strings.HasPrefix(r.msg, msg) {
			out = append(out, r)
		}
	}
	return out
}
