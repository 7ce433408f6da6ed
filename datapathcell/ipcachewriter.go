// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// ipcacheWriter writes the `ipcache` table into the ipcache map through
// mapwrite.Ops, as statedb's reconciler would, but keeps the reconciliation state
// itself instead of writing a status into every row: the revision up to
// which every change was attempted, and the keys whose write failed. The
// status write-back of statedb's reconciler is a copy-on-write insert of
// every entry into the table's indexes, a large share of the work of
// writing a million prefixes (docs/SCALE.md, "The ipcache map's status
// kept by its writer, not in the rows"). An entry's status
// follows from its revision (status).
//
// It implements reconciler.Reconciler, which the ordering of make before
// break waits on, with the same meaning: WaitUntilReconciled returns the
// revision up to which every change was attempted and the lowest revision
// of an object still failing.
type ipcacheWriter struct {
	db       *statedb.DB
	table    statedb.RWTable[*ipcachecell.Entry]
	ops      *mapwrite.Ops[*ipcachecell.Entry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]
	metrics  reconciler.Metrics
	moduleID cell.FullModuleID
	log      *slog.Logger

	pruneInterval          time.Duration
	roundSize              int
	limiter                *rate.Limiter
	minBackoff, maxBackoff time.Duration

	pruneTrigger chan struct{}

	// afterRound, if set, is called at the end of each round with its
	// snapshot: the deny guard recomputes what the held keys need.
	afterRound func(statedb.ReadTxn)

	// Owned by the writer's goroutine: the failed keys, by key, by the
	// time of their next retry and by their object's revision.
	failing    map[bpfmaps.IPCacheKey]*failure
	retryQueue failureQueue
	revQueue   failureQueue
	retryTimer *time.Timer
	retryDue   chan struct{}
	// drained are the table revisions of the latest snapshots whose every
	// change was attempted (the round's changes ran out before its
	// limit), oldest first, at most maxDrained (see wroteRevision).
	drained []statedb.Revision
	// updates and deletes are the last round's batches, emptied, for the
	// next round to fill: grown anew each round, they were much of the
	// garbage of a million prefixes' first write (docs/SCALE.md, issue 38).
	updates, deletes []reconciler.BatchEntry[*ipcachecell.Entry]

	// attempted is the revision up to which every change was attempted;
	// numFailing counts the failed keys. Both let status answer without
	// the lock while nothing fails, which is almost always.
	attempted  atomic.Uint64
	numFailing atomic.Int64

	mu sync.Mutex
	// failedRevs are the errors of the failing objects, by revision.
	failedRevs   map[statedb.Revision]error
	lowWatermark statedb.Revision
	// progressed is closed and replaced when attempted or the low
	// watermark moves.
	progressed chan struct{}
}

// failure is a key whose last write (or delete) failed, with the object
// of the revision that failed; it is retried until written or superseded
// by a newer change of the key.
type failure struct {
	key      bpfmaps.IPCacheKey
	obj      *ipcachecell.Entry
	rev      statedb.Revision
	deleted  bool
	err      error
	attempts int
	retryAt  time.Time
	// indexes in retryQueue and revQueue.
	retryIndex, revIndex int
}

var _ reconciler.Reconciler[*ipcachecell.Entry] = (*ipcacheWriter)(nil)

// maxDrained bounds ipcacheWriter.drained: what it forgets makes
// wroteRevision answer false for a change that waited longer than that
// many rounds, which costs one write of an unchanged value.
const maxDrained = 1024

func newIPCacheWriter(p reconciler.Params, table statedb.RWTable[*ipcachecell.Entry],
	ops *mapwrite.Ops[*ipcachecell.Entry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]) *ipcacheWriter {
	metrics := p.DefaultMetrics
	if metrics == nil {
		metrics = reconciler.NewUnpublishedExpVarMetrics()
	}
	w := &ipcacheWriter{
		db: p.DB, table: table, ops: ops, metrics: metrics, moduleID: p.ModuleID, log: p.Log,
		pruneInterval: time.Minute,
		roundSize:     reconcilerRoundSize,
		limiter:       rate.NewLimiter(reconcilerRoundRate, 1),
		minBackoff:    reconcilerMinBackoff,
		maxBackoff:    reconcilerMaxBackoff,
		pruneTrigger:  make(chan struct{}, 1),
		failing:       map[bpfmaps.IPCacheKey]*failure{},
		failedRevs:    map[statedb.Revision]error{},
		progressed:    make(chan struct{}),
	}
	w.retryQueue = failureQueue{
		less:  func(a, b *failure) bool { return a.retryAt.Before(b.retryAt) },
		index: func(f *failure) *int { return &f.retryIndex },
	}
	w.revQueue = failureQueue{
		less:  func(a, b *failure) bool { return a.rev < b.rev },
		index: func(f *failure) *int { return &f.revIndex },
	}
	return w
}

// Prune implements reconciler.Reconciler: a prune at the next round, once
// the table is initialized.
func (w *ipcacheWriter) Prune() {
	select {
	case w.pruneTrigger <- struct{}{}:
	default:
	}
}

// WaitUntilReconciled implements reconciler.Reconciler.
func (w *ipcacheWriter) WaitUntilReconciled(ctx context.Context, until statedb.Revision) (statedb.Revision, statedb.Revision, error) {
	for {
		w.mu.Lock()
		rev, low, progressed := statedb.Revision(w.attempted.Load()), w.lowWatermark, w.progressed
		w.mu.Unlock()
		if rev >= until {
			return rev, low, nil
		}
		select {
		case <-ctx.Done():
			return rev, low, ctx.Err()
		case <-progressed:
		}
	}
}

// status returns the reconciliation status of the entry of revision rev:
// Done if its change was attempted and it is not failing, Error with the
// error if it is failing, Pending otherwise.
func (w *ipcacheWriter) status(rev statedb.Revision) (reconciler.StatusKind, error) {
	// attempted is read first: a failure is recorded before attempted
	// moves past its revision.
	attempted := statedb.Revision(w.attempted.Load())
	if w.numFailing.Load() != 0 {
		w.mu.Lock()
		err, failed := w.failedRevs[rev]
		w.mu.Unlock()
		if failed {
			return reconciler.StatusKindError, err
		}
	}
	if rev != 0 && rev <= attempted {
		return reconciler.StatusKindDone, nil
	}
	return reconciler.StatusKindPending, nil
}

// run is the writer's job: rounds of at most roundSize changes and due
// retries, and the prunes.
func (w *ipcacheWriter) run(ctx context.Context, health cell.Health) error {
	wtxn := w.db.WriteTxn(w.table)
	changes, err := w.table.Changes(wtxn)
	txn := wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch the %s table's changes: %w", ipcachecell.EntriesTableName, err)
	}
	defer changes.Close()
	defer func() {
		if w.retryTimer != nil {
			w.retryTimer.Stop()
		}
	}()

	pruneTicker := time.NewTicker(w.pruneInterval)
	defer pruneTicker.Stop()
	_, initWatch := w.table.Initialized(txn)
	initialized, prune := false, false
	var tableWatch <-chan struct{} = closedChan

	for {
		// A round at most every so often, so that a batch builds up.
		if err := w.limiter.Wait(ctx); err != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.retryDue:
		case <-tableWatch:
		case <-initWatch:
			initialized, initWatch, prune = true, nil, true
		case <-pruneTicker.C:
			prune = true
		case <-w.pruneTrigger:
			prune = true
		}
		txn := w.db.ReadTxn()
		seq, watch := changes.Next(txn)
		tableWatch = watch

		newErrors := w.round(ctx, txn, seq)
		var errs []error
		for _, f := range w.failing {
			errs = append(errs, f.err)
		}
		w.metrics.ReconciliationErrors(w.moduleID, bpfmaps.IPCacheName, newErrors, len(errs))

		if initialized && prune {
			prune = false
			start := time.Now()
			err := w.ops.Prune(ctx, txn, w.table.All(txn))
			if err != nil {
				w.log.Warn("Failed to prune the ipcache map", "error", err)
				err = fmt.Errorf("prune: %w", err)
				errs = append(errs, err)
			}
			w.metrics.PruneDuration(w.moduleID, bpfmaps.IPCacheName, time.Since(start))
			w.metrics.PruneError(w.moduleID, bpfmaps.IPCacheName, err)
		}
		if len(errs) == 0 {
			health.OK(fmt.Sprintf("OK, %d object(s)", w.table.NumObjects(txn)))
		} else {
			health.Degraded(fmt.Sprintf("%d error(s)", len(errs)), joinSome(errs, 10))
		}
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// joinSome joins at most n errors, saying how many it left out.
func joinSome(errs []error, n int) error {
	if len(errs) > n {
		errs = append(errs[:n:n], fmt.Errorf("%d further errors omitted", len(errs)-n))
	}
	return errors.Join(errs...)
}

// round writes up to roundSize changes of seq (deletes first, to make
// room), then retries the failed keys that are due, and publishes the
// progress. It returns how many writes failed.
func (w *ipcacheWriter) round(ctx context.Context, txn statedb.ReadTxn, seq iter.Seq2[statedb.Change[*ipcachecell.Entry], statedb.Revision]) (newErrors int) {
	var (
		updates, deletes = w.updates[:0], w.deletes[:0]
		lastRev          statedb.Revision
		n                int
	)
	defer func() {
		// Emptied so that the kept arrays hold no entry alive.
		clear(updates)
		clear(deletes)
		w.updates, w.deletes = updates[:0], deletes[:0]
	}()
	// drained: the loop ran out of changes, not into the round's limit.
	// (The iterator moves past a change as it yields it: the loop stops
	// after a change, never on one.)
	drained := true
	for change, rev := range seq {
		if n++; n >= w.roundSize {
			drained = false
		}
		lastRev = rev
		// A newer change of a failed key supersedes the failure.
		failing := false
		if len(w.failing) > 0 {
			if f, ok := w.failing[w.ops.Key(change.Object)]; ok {
				w.clearFailure(f)
				failing = true
			}
		}
		// Only the source changed, and the map has the identity of the
		// entry this one replaced: nothing to write.
		entry := reconciler.BatchEntry[*ipcachecell.Entry]{Object: change.Object, Revision: rev}
		switch since := change.Object.IdentityUnchangedSince(); {
		case change.Deleted:
			deletes = append(deletes, entry)
		case since != 0 && !failing && w.wroteRevision(since, rev):
			w.ops.Stats.Unchanged.Add(1)
		default:
			updates = append(updates, entry)
		}
		if !drained {
			break
		}
	}
	if drained {
		if t := w.table.Revision(txn); len(w.drained) == 0 || t > w.drained[len(w.drained)-1] {
			if len(w.drained) == maxDrained {
				w.drained = append(w.drained[:0], w.drained[maxDrained/2:]...)
			}
			w.drained = append(w.drained, t)
		}
	}
	if len(deletes) > 0 {
		start := time.Now()
		w.ops.DeleteBatch(ctx, txn, deletes)
		w.metrics.ReconciliationDuration(w.moduleID, bpfmaps.IPCacheName, reconciler.OpDelete, time.Since(start))
		newErrors += w.results(deletes, true)
	}
	if len(updates) > 0 {
		start := time.Now()
		w.ops.UpdateBatch(ctx, txn, updates)
		w.metrics.ReconciliationDuration(w.moduleID, bpfmaps.IPCacheName, reconciler.OpUpdate, time.Since(start))
		newErrors += w.results(updates, false)
	}

	newErrors += w.retry(ctx, txn, w.roundSize-n)
	if w.afterRound != nil {
		w.afterRound(txn)
	}

	w.mu.Lock()
	moved := false
	if lastRev > statedb.Revision(w.attempted.Load()) {
		w.attempted.Store(lastRev)
		moved = true
	}
	low := statedb.Revision(0)
	if w.revQueue.Len() > 0 {
		low = w.revQueue.items[0].rev
	}
	if low != w.lowWatermark {
		w.lowWatermark = low
		moved = true
	}
	if moved {
		close(w.progressed)
		w.progressed = make(chan struct{})
	}
	w.mu.Unlock()
	return newErrors
}

// wroteRevision reports whether the writer attempted, with success, the
// object of revision since, which a change of revision cur replaced (the
// same key). It did if some round attempted every change of a snapshot
// that had since but not yet cur: the rounds before it and that round
// then went past since with snapshots in which since was the key's
// latest revision, so the key's change at since was one of theirs. (A
// change that was superseded before the writer read it is not seen: the
// change iterator gives a key's latest revision only.) The caller checks
// that the key is not failing.
func (w *ipcacheWriter) wroteRevision(since, cur statedb.Revision) bool {
	i, _ := slices.BinarySearch(w.drained, since)
	return i < len(w.drained) && w.drained[i] < cur
}

// results records the failed entries of a batch.
func (w *ipcacheWriter) results(batch []reconciler.BatchEntry[*ipcachecell.Entry], deleted bool) (failed int) {
	for _, e := range batch {
		if e.Result != nil {
			w.fail(e.Object, e.Revision, deleted, e.Result)
			failed++
		}
	}
	return failed
}

// retry writes again, one by one, at most limit failed keys whose retry is
// due. It returns how many failed again.
func (w *ipcacheWriter) retry(ctx context.Context, txn statedb.ReadTxn, limit int) (failed int) {
	now := time.Now()
	for ; limit > 0 && w.retryQueue.Len() > 0; limit-- {
		f := w.retryQueue.items[0]
		if f.retryAt.After(now) {
			break
		}
		heap.Pop(&w.retryQueue)
		var err error
		start := time.Now()
		op := reconciler.OpUpdate
		if f.deleted {
			op = reconciler.OpDelete
			err = w.ops.Delete(ctx, txn, f.rev, f.obj)
		} else {
			err = w.ops.Update(ctx, txn, f.rev, f.obj)
		}
		w.metrics.ReconciliationDuration(w.moduleID, bpfmaps.IPCacheName, op, time.Since(start))
		if err != nil {
			w.fail(f.obj, f.rev, f.deleted, err)
			failed++
			continue
		}
		w.clearFailure(f)
	}
	w.armRetry()
	return failed
}

// fail records that the write of obj's key at revision rev failed, and
// when to retry it: the delay doubles with each failure of the same
// object, from minBackoff up to maxBackoff. The round's retry arms the
// timer once for all (a full map fails thousands of keys at a time).
func (w *ipcacheWriter) fail(obj *ipcachecell.Entry, rev statedb.Revision, deleted bool, err error) {
	k := w.ops.Key(obj)
	f, ok := w.failing[k]
	if ok && f.rev != rev {
		w.clearFailure(f)
		ok = false
	}
	if !ok {
		f = &failure{key: k, obj: obj, rev: rev, deleted: deleted, retryIndex: -1, revIndex: -1}
		w.failing[k] = f
		w.numFailing.Add(1)
		heap.Push(&w.revQueue, f)
	}
	f.err = err
	delay := w.maxBackoff
	if f.attempts < 30 {
		delay = min(w.minBackoff<<f.attempts, w.maxBackoff)
	}
	f.attempts++
	f.retryAt = time.Now().Add(delay)
	if f.retryIndex >= 0 {
		heap.Fix(&w.retryQueue, f.retryIndex)
	} else {
		heap.Push(&w.retryQueue, f)
	}
	w.mu.Lock()
	w.failedRevs[rev] = err
	w.mu.Unlock()
}

// clearFailure forgets a failed key: written, or superseded.
func (w *ipcacheWriter) clearFailure(f *failure) {
	delete(w.failing, f.key)
	w.numFailing.Add(-1)
	if f.retryIndex >= 0 {
		heap.Remove(&w.retryQueue, f.retryIndex)
	}
	if f.revIndex >= 0 {
		heap.Remove(&w.revQueue, f.revIndex)
	}
	w.mu.Lock()
	delete(w.failedRevs, f.rev)
	w.mu.Unlock()
}

// armRetry makes retryDue close when the earliest retry is due.
func (w *ipcacheWriter) armRetry() {
	if w.retryTimer != nil {
		w.retryTimer.Stop()
		w.retryTimer = nil
	}
	if w.retryQueue.Len() == 0 {
		w.retryDue = nil
		return
	}
	due := make(chan struct{})
	w.retryDue = due
	w.retryTimer = time.AfterFunc(time.Until(w.retryQueue.items[0].retryAt), func() { close(due) })
}

// failureQueue is a heap of failures ordered by less, each knowing its
// index so that it can be removed.
type failureQueue struct {
	items []*failure
	less  func(a, b *failure) bool
	index func(*failure) *int
}

func (q *failureQueue) Len() int           { return len(q.items) }
func (q *failureQueue) Less(i, j int) bool { return q.less(q.items[i], q.items[j]) }
func (q *failureQueue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	*q.index(q.items[i]), *q.index(q.items[j]) = i, j
}
func (q *failureQueue) Push(x any) {
	f := x.(*failure)
	*q.index(f) = len(q.items)
	q.items = append(q.items, f)
}
func (q *failureQueue) Pop() any {
	f := q.items[len(q.items)-1]
	q.items[len(q.items)-1] = nil
	q.items = q.items[:len(q.items)-1]
	*q.index(f) = -1
	return f
}
