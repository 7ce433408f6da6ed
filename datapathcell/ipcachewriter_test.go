// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// failingMap is a fake ipcache map whose writes of chosen keys fail, and
// which counts the keys written.
type failingMap struct {
	mapwrite.Map
	mu     sync.Mutex
	fail   map[bpfmaps.IPCacheKey]error
	failed map[bpfmaps.IPCacheKey]int
	writes int
}

func (m *failingMap) failFor(k bpfmaps.IPCacheKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.fail[k]
	if err != nil {
		m.failed[k]++
	}
	return err
}

// failures returns how many writes of prefix failed.
func (m *failingMap) failures(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed[bpfmaps.NewIPCacheKey(netip.MustParsePrefix(prefix))]
}

func (m *failingMap) setFail(p netip.Prefix, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		delete(m.fail, bpfmaps.NewIPCacheKey(p))
		return
	}
	m.fail[bpfmaps.NewIPCacheKey(p)] = err
}

func (m *failingMap) written() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

func (m *failingMap) Put(key, value any) error {
	if err := m.failFor(*key.(*bpfmaps.IPCacheKey)); err != nil {
		return err
	}
	m.mu.Lock()
	m.writes++
	m.mu.Unlock()
	return m.Map.Put(key, value)
}

func (m *failingMap) BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error) {
	ks, vs := keys.([]bpfmaps.IPCacheKey), values.([]bpfmaps.IPCacheValue)
	for i, k := range ks {
		if err := m.failFor(k); err != nil {
			n, _ := m.BatchUpdate(ks[:i], vs[:i], opts)
			return n, err
		}
	}
	m.mu.Lock()
	m.writes += len(ks)
	m.mu.Unlock()
	return m.Map.BatchUpdate(keys, values, opts)
}

// writerFixture runs an ipcache writer over a fake map and an `ipcache`
// table of its own, without the rest of the agent: no gate, no hold.
type writerFixture struct {
	t      *testing.T
	db     *statedb.DB
	table  statedb.RWTable[*ipcachecell.Entry]
	m      *failingMap
	maps   *recordingMaps
	stats  *mapwrite.Stats
	writer *ipcacheWriter
	health *cell.SimpleHealth
	// initialized marks the table initialized.
	initialized func(statedb.WriteTxn)
}

// newWriterFixture starts a writer over a map that holds pinned at start.
func newWriterFixture(t *testing.T, pinned map[netip.Prefix]uint32) *writerFixture {
	f := &writerFixture{t: t, db: statedb.New(), maps: newRecordingMaps(t, 0), stats: &mapwrite.Stats{}}
	table, err := ipcachecell.NewEntriesTable(f.db)
	require.NoError(t, err)
	f.table = table
	require.NoError(t, f.db.Start())
	txn := f.db.WriteTxn(table)
	f.initialized = table.RegisterInitializer(txn, "test")
	txn.Commit()

	f.m = &failingMap{Map: f.maps.maps().ipcache, fail: map[bpfmaps.IPCacheKey]error{}, failed: map[bpfmaps.IPCacheKey]int{}}
	snapshot := bpfmaps.IPCacheSnapshot{Unreadable: map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue{}}
	for p, id := range pinned {
		k, v := bpfmaps.NewIPCacheKey(p), bpfmaps.NewIPCacheValue(identity.Number(id))
		f.maps.ipcache[k] = v
		snapshot.Entries = append(snapshot.Entries, bpfmaps.IPCacheEntry{Prefix: p, Identity: identity.Number(id)})
	}
	slices.SortFunc(snapshot.Entries, func(a, b bpfmaps.IPCacheEntry) int { return prefixkey.Compare(a.Prefix, b.Prefix) })
	ops := &mapwrite.Ops[*ipcachecell.Entry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]{
		Name:       bpfmaps.IPCacheName,
		Target:     func() mapwrite.Map { return f.m },
		Stats:      f.stats,
		Key:        func(e *ipcachecell.Entry) bpfmaps.IPCacheKey { return bpfmaps.NewIPCacheKey(e.Prefix()) },
		Value:      func(e *ipcachecell.Entry) bpfmaps.IPCacheValue { return bpfmaps.NewIPCacheValue(e.Identity) },
		WriteOrder: bpfmaps.IPCacheKey.Compare,
		ReadPinned: func() mapwrite.KnownValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue] {
			return mapwrite.NewSnapshotValues(snapshot)
		},
	}
	f.writer = newIPCacheWriter(reconciler.Params{DB: f.db, Log: hivetest.Logger(t)}, table, ops)
	var health cell.Health
	health, f.health = cell.NewSimpleHealth()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.writer.run(ctx, health) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, f.db.Stop())
	})
	return f
}

// upsert writes an entry and returns its revision.
func (f *writerFixture) upsert(prefix string, id uint32, src source.Source) statedb.Revision {
	txn := f.db.WriteTxn(f.table)
	_, _, err := f.table.Insert(txn, ipcachecell.NewEntry(netip.MustParsePrefix(prefix), identity.Number(id), src))
	require.NoError(f.t, err)
	rev := f.table.Revision(txn)
	txn.Commit()
	return rev
}

func (f *writerFixture) remove(prefix string) statedb.Revision {
	txn := f.db.WriteTxn(f.table)
	_, _, err := f.table.Delete(txn, ipcachecell.NewEntry(netip.MustParsePrefix(prefix), 0, 0))
	require.NoError(f.t, err)
	rev := f.table.Revision(txn)
	txn.Commit()
	return rev
}

func (f *writerFixture) healthLevel() cell.Level {
	f.health.Lock()
	defer f.health.Unlock()
	return f.health.Level
}

func (f *writerFixture) initialize() {
	txn := f.db.WriteTxn(f.table)
	f.initialized(txn)
	txn.Commit()
}

// inMap returns the map's value for prefix.
func (f *writerFixture) inMap(prefix string) (uint32, bool) {
	f.maps.mu.Lock()
	defer f.maps.mu.Unlock()
	v, ok := f.maps.ipcache[bpfmaps.NewIPCacheKey(netip.MustParsePrefix(prefix))]
	return uint32(v.Identity()), ok
}

// waitStatus waits until the entry of revision rev has status kind.
func (f *writerFixture) waitStatus(rev statedb.Revision, kind reconciler.StatusKind) error {
	f.t.Helper()
	var err error
	require.Eventually(f.t, func() bool {
		var got reconciler.StatusKind
		got, err = f.writer.status(rev)
		return got == kind
	}, 10*time.Second, time.Millisecond, "revision %d never %s", rev, kind)
	return err
}

// A key whose write fails is Error with the kernel's error, holds the
// retry low watermark at its revision and makes health degraded; it is
// retried until the write succeeds, then Done, and the watermark clears.
// The other keys of its batch are written meanwhile.
func TestIPCacheWriterRetriesFailedKey(t *testing.T) {
	t.Parallel()
	f := newWriterFixture(t, nil)
	failure := errors.New("injected failure")
	f.m.setFail(netip.MustParsePrefix("10.0.0.2/32"), failure)
	revA := f.upsert("10.0.0.1/32", 100, source.Local)
	revB := f.upsert("10.0.0.2/32", 200, source.Local)

	require.ErrorIs(t, f.waitStatus(revB, reconciler.StatusKindError), failure)
	// Waited for: the failure is recorded before the round's progress
	// passes revA.
	require.NoError(t, f.waitStatus(revA, reconciler.StatusKindDone))
	attempted, low, err := f.writer.WaitUntilReconciled(context.Background(), revB)
	require.NoError(t, err)
	require.GreaterOrEqual(t, attempted, revB)
	require.Equal(t, revB, low, "the failing object's revision is the low watermark")
	require.Eventually(t, func() bool {
		return f.healthLevel() == cell.StatusDegraded
	}, 10*time.Second, time.Millisecond)
	id, ok := f.inMap("10.0.0.1/32")
	require.True(t, ok)
	require.EqualValues(t, 100, id)
	_, ok = f.inMap("10.0.0.2/32")
	require.False(t, ok)

	// Still failing after a few retries.
	require.Eventually(t, func() bool { return f.m.failures("10.0.0.2/32") >= 3 },
		10*time.Second, time.Millisecond, "retried with backoff")
	kind, err := f.writer.status(revB)
	require.Equal(t, reconciler.StatusKindError, kind)
	require.ErrorIs(t, err, failure)

	f.m.setFail(netip.MustParsePrefix("10.0.0.2/32"), nil)
	require.NoError(t, f.waitStatus(revB, reconciler.StatusKindDone))
	id, ok = f.inMap("10.0.0.2/32")
	require.True(t, ok)
	require.EqualValues(t, 200, id)
	_, low, err = f.writer.WaitUntilReconciled(context.Background(), revB)
	require.NoError(t, err)
	require.Zero(t, low, "nothing fails")
	require.Eventually(t, func() bool { return f.healthLevel() == cell.StatusOK }, 10*time.Second, time.Millisecond)
}

// A newer change of a failing key supersedes the failure: the old
// revision is no longer Error, the watermark moves, and the new value is
// written when it can be.
func TestIPCacheWriterNewChangeSupersedesFailure(t *testing.T) {
	t.Parallel()
	f := newWriterFixture(t, nil)
	failure := errors.New("injected failure")
	f.m.setFail(netip.MustParsePrefix("10.0.0.2/32"), failure)
	old := f.upsert("10.0.0.2/32", 200, source.Local)
	require.ErrorIs(t, f.waitStatus(old, reconciler.StatusKindError), failure)

	f.m.setFail(netip.MustParsePrefix("10.0.0.2/32"), nil)
	newer := f.upsert("10.0.0.2/32", 300, source.Local)
	require.NoError(t, f.waitStatus(newer, reconciler.StatusKindDone))
	kind, _ := f.writer.status(old)
	require.Equal(t, reconciler.StatusKindDone, kind, "superseded, no longer failing")
	id, ok := f.inMap("10.0.0.2/32")
	require.True(t, ok)
	require.EqualValues(t, 300, id)

	del := f.remove("10.0.0.2/32")
	_, _, err := f.writer.WaitUntilReconciled(context.Background(), del)
	require.NoError(t, err)
	_, ok = f.inMap("10.0.0.2/32")
	require.False(t, ok, "deleted")
}

// After a restart, an entry restored with the value the map holds, then
// re-asserted by its owner (only its source changes), costs no map write;
// both revisions are Done.
func TestIPCacheWriterSourceOnlyChangeWritesNothing(t *testing.T) {
	t.Parallel()
	f := newWriterFixture(t, map[netip.Prefix]uint32{netip.MustParsePrefix("10.0.0.1/32"): 100})
	restored := f.upsert("10.0.0.1/32", 100, source.Restored)
	require.NoError(t, f.waitStatus(restored, reconciler.StatusKindDone))
	owned := f.upsert("10.0.0.1/32", 100, source.Local)
	require.NoError(t, f.waitStatus(owned, reconciler.StatusKindDone))
	require.Zero(t, f.m.written(), "the map already held the value")
	require.EqualValues(t, 2, f.stats.Unchanged.Load(), "both skipped")

	// A new value is written.
	changed := f.upsert("10.0.0.1/32", 101, source.Local)
	require.NoError(t, f.waitStatus(changed, reconciler.StatusKindDone))
	require.Equal(t, 1, f.m.written())
}

// The writer prunes once the table is initialized (not before), then when
// asked: keys no entry has are deleted.
func TestIPCacheWriterPrunesAfterInitialization(t *testing.T) {
	t.Parallel()
	f := newWriterFixture(t, map[netip.Prefix]uint32{
		netip.MustParsePrefix("10.0.0.1/32"): 100,
		netip.MustParsePrefix("10.9.9.9/32"): 999, // stale: no entry
	})
	rev := f.upsert("10.0.0.1/32", 100, source.Local)
	require.NoError(t, f.waitStatus(rev, reconciler.StatusKindDone))
	f.writer.Prune() // not before the table is initialized
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, f.stats.Prunes.Load())
	_, ok := f.inMap("10.9.9.9/32")
	require.True(t, ok, "not pruned before the table is initialized")

	f.initialize()
	require.Eventually(t, func() bool { return f.stats.Prunes.Load() == 1 }, 10*time.Second, time.Millisecond)
	_, ok = f.inMap("10.9.9.9/32")
	require.False(t, ok, "pruned")
	_, ok = f.inMap("10.0.0.1/32")
	require.True(t, ok)

	f.writer.Prune()
	require.Eventually(t, func() bool { return f.stats.Prunes.Load() == 2 }, 10*time.Second, time.Millisecond)
}

// After the first prune (the writer no longer knows the map's content from
// start), an owner re-asserting a prefix another producer holds changes
// only the entry's source: a new revision whose identity the map already
// has, which the writer does not write again.
func TestIPCacheWriterSourceOnlyChangeAfterPrune(t *testing.T) {
	t.Parallel()
	f := newOrderFixture(t, 16384)
	require.Eventually(t, func() bool { return f.datapath.Prunes(bpfmaps.IPCacheName) >= 1 }, 10*time.Second, time.Millisecond)
	prefix := netip.MustParsePrefix("10.7.0.1/32")
	restored, err := f.ipcache.NewHandle("test/restored", source.Restored)
	require.NoError(t, err)
	require.NoError(t, restored.Upsert(prefix, ipcachecell.Metadata{}))
	f.converged("restored", f.has("10.7.0.1/32"))
	written, unchanged := f.datapath.MapWrites(bpfmaps.IPCacheName)
	first, firstRev, _ := f.entries.Get(f.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))

	owner, err := f.ipcache.NewHandle("test/owner", source.Local)
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(prefix, ipcachecell.Metadata{}))
	var rev statedb.Revision
	require.Eventually(t, func() bool {
		var e *ipcachecell.Entry
		e, rev, _ = f.entries.Get(f.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))
		return e.Source == source.Local
	}, 10*time.Second, time.Millisecond)
	_, _, err = f.datapath.ipcacheWriter.WaitUntilReconciled(context.Background(), rev)
	require.NoError(t, err)
	second, _, _ := f.entries.Get(f.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))
	require.Equal(t, first.Identity, second.Identity)
	require.Equal(t, firstRev, second.IdentityUnchangedSince())
	kind, err := f.datapath.IPCacheStatus(rev)
	require.NoError(t, err)
	require.Equal(t, reconciler.StatusKindDone, kind)
	nowWritten, nowUnchanged := f.datapath.MapWrites(bpfmaps.IPCacheName)
	require.Equal(t, written, nowWritten, "no map write")
	require.Equal(t, unchanged+1, nowUnchanged, "counted as unchanged")

	// New labels: a new identity, written.
	appX, err := labels.Parse("app:x")
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(prefix, ipcachecell.Metadata{Labels: appX}))
	f.converged("new identity", func() bool {
		e, _, _ := f.entries.Get(f.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))
		return e.Identity != first.Identity && f.identityOf("10.7.0.1") == uint32(e.Identity)
	})
	nowWritten, _ = f.datapath.MapWrites(bpfmaps.IPCacheName)
	require.Greater(t, nowWritten, written)
}
