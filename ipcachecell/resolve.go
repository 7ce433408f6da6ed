// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

const (
	// A chunk is the prefixes resolved in one write transaction of the
	// identities and ipcache tables. Its size adapts so that a chunk takes
	// about resolveChunkTime: large enough to amortize the commit, short
	// enough that a new change (resolved in the next chunk, see
	// resolveQueue) and the other writers of these tables (the
	// reconciler's status write-back) never wait long.
	resolveChunkTime    = 10 * time.Millisecond
	minResolveChunkSize = 256
	maxResolveChunkSize = 16384

	minRetryBackoff = 100 * time.Millisecond
	maxRetryBackoff = 10 * time.Second

	// maxLoggedFailures bounds the example prefixes a failure log names.
	maxLoggedFailures = 5
)

// resolverName names the resolver as the initializer of the tables it
// writes.
const resolverName = "ipcache-resolver"

// resolver turns the metadata of each changed prefix into its `ipcache`
// entry. It is the only writer of the `ipcache` table and the only owner of
// the ipcache's identity references: one per entry whose identity is not
// explicit.
type resolver struct {
	db        *statedb.DB
	metadata  statedb.RWTable[*PrefixMetadata]
	entries   statedb.RWTable[*Entry]
	allocator *identitycell.Allocator
	log       *slog.Logger
	// resolved publishes the metadata revision resolved up to.
	resolved *progress.Tracker[statedb.Revision]

	// previous is what restore told of the previous run (AddPrevious).
	previous *previousNumbers

	// markInitialized marks the `ipcache` and `identities` tables
	// initialized, in a transaction that locks both; nil once done.
	markInitialized func(statedb.WriteTxn)

	changes statedb.ChangeIterator[*PrefixMetadata]
	// failed holds the prefixes whose resolution failed, with the error.
	// They keep their previous entry (if any) and are retried.
	failed map[netip.Prefix]error
	// held holds the prefixes that need a new local number while the
	// allocator's local space is held (identitycell.ErrLocalHeld: restore
	// has not withheld every number it restores yet). They are queued
	// again once it is released (Allocator.LocalReleased); until then
	// nothing is reported resolved and the tables are not initialized.
	held       map[netip.Prefix]struct{}
	heldTimes  int // resolutions that ended in held, for the log
	retryDue   bool
	retryAfter time.Duration

	// chunkSize is the prefixes to resolve in the next transaction, at
	// most maxChunkSize (tests lower it to make every prefix a chunk).
	chunkSize, maxChunkSize int

	// resolutions counts the prefixes resolved, superseded ones not
	// included; tests use it to show what a change costs.
	resolutions int

	// spare is a chunk's slice the next chunk's read reuses.
	spare []prefetched
}

func newResolver(db *statedb.DB, metadata statedb.RWTable[*PrefixMetadata], entries statedb.RWTable[*Entry],
	allocator *identitycell.Allocator, log *slog.Logger,
	resolved *progress.Tracker[statedb.Revision]) *resolver {
	txn := db.WriteTxn(entries)
	markEntries := entries.RegisterInitializer(txn, resolverName)
	txn.Commit()
	// The resolver is the allocator's client: the identities are what it
	// allocated for the prefixes, so it is their producer as it is the
	// entries'. Both tables are initialized in one transaction: the
	// identities are then complete exactly when the entries that hold
	// them are, and the checkpoint, which waits for the identities, never
	// replaces the previous run's with a partial one.
	markIdentities := allocator.RegisterProducer(resolverName)
	markInitialized := func(txn statedb.WriteTxn) {
		markEntries(txn)
		markIdentities(txn)
	}
	return &resolver{
		db:              db,
		metadata:        metadata,
		entries:         entries,
		allocator:       allocator,
		log:             log,
		resolved:        resolved,
		previous:        newPreviousNumbers(),
		markInitialized: markInitialized,
		failed:          map[netip.Prefix]error{},
		held:            map[netip.Prefix]struct{}{},
		retryAfter:      minRetryBackoff,
		chunkSize:       minResolveChunkSize,
		maxChunkSize:    maxResolveChunkSize,
	}
}

// run resolves changes as they come, and retries failures with backoff.
func (r *resolver) run(ctx context.Context, health cell.Health) error {
	// Closed when the job ends, not left to a runtime cleanup (which
	// fires outside a synctest bubble that ran the hive).
	defer func() {
		if r.changes != nil {
			r.changes.Close()
		}
	}()
	// One retry timer while prefixes fail: re-armed per round, changes
	// that come more often than the backoff would starve the retry.
	var retry <-chan time.Time
	for {
		watch, err := r.round()
		if err != nil {
			return err
		}
		r.reportHealth(health)
		// Until initialized, the producers finishing is a reason for a
		// round too, even when they wrote nothing more.
		var producersDone, localReleased <-chan struct{}
		if r.markInitialized != nil {
			_, producersDone = r.metadata.Initialized(r.db.ReadTxn())
		}
		if len(r.held) > 0 {
			localReleased = r.allocator.LocalReleased()
		}

		switch {
		case len(r.failed) == 0:
			retry = nil
		case retry == nil:
			retry = time.After(r.retryAfter)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-producersDone:
		case <-localReleased:
		case <-retry:
			retry = nil
			r.retryDue = true
			r.retryAfter = min(2*r.retryAfter, maxRetryBackoff)
		}
	}
}

// round resolves every prefix whose metadata changed since the last round
// (and the failed ones, when a retry is due), in transactions of about
// resolveChunkTime each. Between two chunks it takes in what changed
// meanwhile, and shares each chunk among the owners with changes (see
// resolveQueue): an owner's single upsert is not stuck behind another's
// million-prefix release. Prefixes are resolved in address order, so that their entries reach the datapath in
// the order the kernel's LPM trie inserts fastest. It returns a channel
// that closes when there are further changes.
func (r *resolver) round() (<-chan struct{}, error) {
	if r.changes == nil {
		txn := r.db.WriteTxn(r.metadata)
		changes, err := r.metadata.Changes(txn)
		txn.Commit()
		if err != nil {
			return nil, fmt.Errorf("observe ipcache metadata: %w", err)
		}
		r.changes = changes
	}

	var (
		queue       resolveQueue
		snapshot    statedb.ReadTxn
		watch       <-chan struct{}
		newFailures []netip.Prefix
		// reading is the chunk whose metadata is being read while the
		// one before it is written.
		reading <-chan prefetchedChunk
	)
	hadFailures := len(r.failed) > 0
	if r.heldTimes > 0 && !r.allocator.LocalHeld() {
		r.log.Info("Resolving the prefixes that waited for restore to withhold the previous run's numbers",
			"prefixes", len(r.held), "waits", r.heldTimes)
		r.heldTimes = 0
		for prefix := range r.held {
			queue.add("", prefix, math.MaxUint64) // as a retry: never superseded
		}
		clear(r.held)
	}
	if r.retryDue {
		r.retryDue = false
		for prefix := range r.failed {
			queue.add("", prefix, math.MaxUint64) // a lane of their own, never superseded
		}
	}
	for {
		snapshot = r.db.ReadTxn()
		var changed iter.Seq2[statedb.Change[*PrefixMetadata], statedb.Revision]
		changed, watch = r.changes.Next(snapshot)
		for change, revision := range changed {
			queue.add(change.Object.Resource(), change.Object.Prefix(), revision)
		}
		// The next chunk's metadata is read on another goroutine while
		// this one's is written: the read (the rows, their merge, the
		// labels wanted) and the write (identities and entries) each take
		// about half of a chunk's time, and the write transaction is the
		// one that must be on a single goroutine.
		//
		// Reading before the write is correct because the metadata is
		// read from a snapshot at least as new as the changes taken into
		// the queue: a prefix is resolved for the change that queued it
		// or a later one. A change committed after that snapshot (while
		// the chunk before it is written, or between the read and this
		// chunk's write) has a later revision, and the change iterator
		// delivers it in a later pass of this loop, which resolves the
		// prefix again from the rows as they are then. This is what
		// reading in the write transaction relied on too: that also is a
		// snapshot of the metadata, which its writers do not lock.
		var next <-chan prefetchedChunk
		if chunk := queue.next(r.chunkSize); len(chunk) > 0 {
			next = r.prefetch(chunk)
		}
		if reading == nil && next == nil {
			break
		}
		if reading != nil {
			waited := time.Now() // see write
			newFailures = r.write(<-reading, waited, newFailures)
		}
		reading = next
	}
	// A large round's chunks are as large as they get: the agent would
	// keep that slice between rounds, most of which are a few prefixes.
	r.spare = nil
	// Everything up to the snapshot is resolved (or failed, and is
	// retried), unless prefixes wait for the local space.
	if len(r.held) > 0 {
		return watch, nil
	}
	r.resolved.Set(r.metadata.Revision(snapshot))
	r.logFailures(newFailures)
	if hadFailures && len(r.failed) == 0 {
		r.log.Info("All prefixes resolved after earlier failures")
		r.retryAfter = minRetryBackoff
	}

	// Every producer had finished in the snapshot, and everything up to
	// the snapshot is resolved: the table now says what the producers want.
	if r.markInitialized != nil {
		if initialized, _ := r.metadata.Initialized(snapshot); initialized {
			txn := r.allocator.WriteTxn(r.entries)
			r.markInitialized(txn)
			txn.Commit()
			r.markInitialized = nil
			r.log.Info("ipcache table initialized", "entries", r.entries.NumObjects(r.db.ReadTxn()))
		}
	}
	return watch, nil
}

// resolveQueue is the prefixes a round has yet to resolve, in one lane per
// resource whose metadata changed. A chunk is shared among the lanes: one
// owner's million-prefix batch (a grace-period release, a large policy)
// does not hold up another owner's single change, which waits for about
// two chunks (the one being written, and the one read meanwhile). Each
// lane is first in, first out.
//
// A prefix queued twice (by two owners, or changed again while queued) is
// taken once if both fall in one chunk, else twice; a set of the queued
// prefixes, to keep each once, cost a map insert and delete per prefix
// (docs/SCALE.md). Each is queued with the revision of its change instead:
// the resolver skips it when one of the prefix's rows is newer (see
// resolver.resolve), so that it is resolved once, for the last change,
// whichever lane that came in (a restart: restore's lane and the owner's
// hold the same million prefixes, taken at different points).
type resolveQueue struct {
	lanes map[string]*lane
	order []string // lanes with prefixes, in turn order
}

// lane is one resource's queued prefixes, first in, first out, in blocks:
// a lane of a million grows without copying what it holds (growing one
// slice was most of what queueing cost), and a block taken is garbage.
type lane struct {
	blocks  [][]queuedPrefix // the first one partly taken
	n       int              // prefixes queued
	nextCap int              // of the next block: small lanes stay small
}

// Blocks grow from minLaneBlock to maxLaneBlock prefixes: the largest
// still a small allocation.
const (
	minLaneBlock = 16
	maxLaneBlock = 512
)

func (l *lane) push(p queuedPrefix) {
	if last := len(l.blocks) - 1; last >= 0 && len(l.blocks[last]) < cap(l.blocks[last]) {
		l.blocks[last] = append(l.blocks[last], p)
		l.n++
		return
	}
	l.nextCap = min(max(2*l.nextCap, minLaneBlock), maxLaneBlock)
	block := make([]queuedPrefix, 1, l.nextCap)
	block[0] = p
	l.blocks = append(l.blocks, block)
	l.n++
}

// take appends the first k prefixes (at most all) to out and removes them.
func (l *lane) take(k int, out []queuedPrefix) []queuedPrefix {
	for k > 0 && len(l.blocks) > 0 {
		block := l.blocks[0]
		m := min(k, len(block))
		out = append(out, block[:m]...)
		k, l.n = k-m, l.n-m
		if m == len(block) {
			l.blocks[0] = nil
			l.blocks = l.blocks[1:]
		} else {
			// The block keeps its capacity's end: push fills it up.
			l.blocks[0] = block[m:]
		}
	}
	return out
}

// queuedPrefix is a prefix whose metadata changed, and the revision of
// the change. The prefix is compact: without netip.Addr's zone pointer, a
// lane's blocks are memory the collector does not scan, and copying them
// into a chunk needs no write barriers (a restart queues two million).
type queuedPrefix struct {
	key     compactPrefix
	changed statedb.Revision
}

// add queues a prefix whose metadata of resource changed at revision
// changed.
func (q *resolveQueue) add(resource string, prefix netip.Prefix, changed statedb.Revision) {
	if q.lanes == nil {
		q.lanes = map[string]*lane{}
	}
	l, active := q.lanes[resource]
	if !active {
		l = &lane{}
		q.lanes[resource] = l
		q.order = append(q.order, resource)
	}
	l.push(queuedPrefix{compact(prefix), changed})
}

// next takes up to n prefixes, an equal share from each lane (what a lane
// does not use goes to the others), in address order and each once: the
// order in which their entries reach the datapath, and in which the
// kernel's LPM trie inserts fastest.
func (q *resolveQueue) next(n int) []queuedPrefix {
	queued := 0
	for _, resource := range q.order {
		queued += q.lanes[resource].n
	}
	if queued == 0 {
		return nil
	}
	chunk := make([]queuedPrefix, 0, min(n, queued))
	for len(chunk) < n && len(q.order) > 0 {
		share := max((n-len(chunk))/len(q.order), 1)
		for _, resource := range q.order {
			chunk = q.lanes[resource].take(min(share, n-len(chunk)), chunk)
		}
		q.order = slices.DeleteFunc(q.order, func(resource string) bool {
			if q.lanes[resource].n == 0 {
				delete(q.lanes, resource)
				return true
			}
			return false
		})
	}
	// The next chunk starts with another lane.
	if len(q.order) > 1 {
		q.order = append(q.order[1:], q.order[0])
	}
	// A lane's prefixes mostly come in address order (batches are written
	// so): sorting is then a check.
	if !slices.IsSortedFunc(chunk, compareQueued) {
		slices.SortFunc(chunk, compareQueued)
	}
	// Of a prefix queued twice, the last change (first in the order): the
	// other is superseded by it.
	return slices.CompactFunc(chunk, func(a, b queuedPrefix) bool { return a.key == b.key })
}

// compareQueued orders by prefix, then the latest change first.
func compareQueued(a, b queuedPrefix) int {
	if c := a.key.compare(b.key); c != 0 {
		return c
	}
	return cmp.Compare(b.changed, a.changed)
}

// adaptChunkSize sizes the next chunk from how long a full one took.
func (r *resolver) adaptChunkSize(resolved int, took time.Duration) {
	if resolved < r.chunkSize || took <= 0 {
		return // a partial chunk says little about a full one
	}
	scaled := int(float64(r.chunkSize) * float64(resolveChunkTime) / float64(took))
	// Move halfway: one slow chunk (a GC pause) does not collapse the size.
	r.chunkSize = min(max((r.chunkSize+scaled)/2, minResolveChunkSize), r.maxChunkSize)
}

// resolution is the merge of all resources' metadata for one prefix.
type resolution struct {
	labels            labels.Labels
	source            source.Source
	requested         identity.Number
	requestedBy       *owner // set with requested
	explicit          identity.Number
	explicitBy        *owner // set with explicit
	hasAnyMetadataRow bool
	// shared is set when a row's handle has the SharedIdentity option.
	shared bool
	// want is labels with the prefix's cidr label (see wantedLabels),
	// unless cidrOnly.
	want labels.Labels
	// cidrOnly is set when the rows have no labels and ask for no shared
	// or explicit identity: the prefix's identity is its cidr label alone,
	// which resolveRows builds (cidrLabels).
	cidrOnly bool
}

// merge folds one resource's row into the resolution. Among rows of equal
// source, the resource first by name sets the requested and explicit
// identity: the rows do not come in name order (see metadataKey), and the
// outcome must not depend on which resource got its handle first.
func (res *resolution) merge(row *PrefixMetadata) {
	if row.labels != nil {
		res.labels = res.labels.Union(*row.labels)
	}
	if !res.hasAnyMetadataRow || row.Source().Overrides(res.source) {
		res.source = row.Source()
	}
	res.hasAnyMetadataRow = true
	res.shared = res.shared || row.owner.shared
	if row.requested != identity.Unknown &&
		(res.requested == identity.Unknown || row.owner.precedes(res.requestedBy)) {
		res.requested, res.requestedBy = row.requested, row.owner
	}
	if row.explicit != identity.Unknown &&
		(res.explicit == identity.Unknown || row.owner.precedes(res.explicitBy)) {
		res.explicit, res.explicitBy = row.explicit, row.owner
	}
}

// precedes reports whether o's metadata wins over other's: a source of
// higher precedence, or the same source and a resource first by name.
func (o *owner) precedes(other *owner) bool {
	if o.source != other.source {
		return o.source.Overrides(other.source)
	}
	return o.resource < other.resource
}

// prefetched is a queued prefix with the merge of its rows, read from a
// snapshot ahead of its write.
type prefetched struct {
	prefix  netip.Prefix
	changed statedb.Revision
	// superseded is set when one of the prefix's rows is newer than the
	// change that queued it: that row's change is queued too, or was
	// resolved already in a transaction that saw this one (its revision
	// is later), so resolving now would do again what that does or did.
	// A deleted row leaves nothing to compare with: a deletion's prefix is
	// resolved as queued.
	superseded bool
	// told is the prefix's place among the previous numbers restore told
	// (previousNumbers), or -1.
	told int32
	res  resolution
}

// prefetchedChunk is a chunk read ahead of its write.
type prefetchedChunk struct {
	rows []prefetched
	// whileHeld is set when the allocator's local space was held when
	// the chunk was read: restore had not written all its rows yet.
	whileHeld bool
}

// prefetch reads the metadata of the chunk's prefixes from a new snapshot
// on a goroutine of its own, and sends the chunk with their merge on the
// returned channel. It only reads: it ends without waiting for anyone, so
// a round that receives every chunk it started leaves no goroutine
// behind.
func (r *resolver) prefetch(chunk []queuedPrefix) <-chan prefetchedChunk {
	out := r.spare[:0]
	if cap(out) < len(chunk) {
		out = make([]prefetched, 0, len(chunk))
	}
	r.spare = nil
	done := make(chan prefetchedChunk, 1)
	go func() {
		// Before the snapshot: released, restore's rows are all in it.
		whileHeld := r.allocator.LocalHeld()
		txn := r.db.ReadTxn()
		for _, queued := range chunk {
			out = append(out, prefetched{prefix: queued.key.prefix(), changed: queued.changed, told: -1})
		}
		r.readRows(txn, out)
		// Read-locked for the chunk: restore adds numbers a block at a
		// time, and holds them until the grace period is over.
		r.previous.mu.RLock()
		for i := range out {
			p := &out[i]
			if p.res.hasAnyMetadataRow && !p.superseded {
				p.told = r.previous.lookupLocked(p.prefix)
				// What restore's row requested, when it had one: the
				// number withheld for the prefix (see previousNumbers).
				if p.told >= 0 && p.res.requested == identity.Unknown {
					p.res.requested = r.previous.told[p.told].number
				}
			}
			switch {
			case p.superseded || !p.res.hasAnyMetadataRow || p.res.explicit != identity.Unknown:
			case p.res.labels.IsEmpty() && !p.res.shared:
				p.res.cidrOnly = true
			default:
				p.res.want = wantedLabels(p.res.labels, p.prefix, p.res.shared)
			}
		}
		r.previous.mu.RUnlock()
		done <- prefetchedChunk{rows: out, whileHeld: whileHeld}
	}()
	return done
}

// readRows merges into each of rows (in address order, each prefix once)
// the metadata rows of its prefix, up to the first row newer than the
// change that queued it (which marks it superseded).
//
// It reads them in walks of the table, not in a prefix search per
// prefix, which costs an iterator and a descent each (most of a large
// load's read, docs/SCALE.md): the table holds a prefix's rows next to
// each other and in the chunk's order, and a chunk of a large batch is a
// run of adjacent prefixes, or a few runs (one per lane). A walk passes
// the rows of prefixes not in the chunk that lie between its prefixes;
// once it has passed maxPassedRows in a row, it seeks again from the
// next prefix of the chunk: a chunk spread over a table of other prefixes
// costs about a seek per prefix, as the searches did.
func (r *resolver) readRows(txn statedb.ReadTxn, rows []prefetched) {
	var (
		i       int
		keyBuf  [prefixkey.MaxLen]byte
		want    []byte
		passed  int
		seekOn  bool
		visitor = func(row *PrefixMetadata, revision statedb.Revision) bool {
			got := row.key[:prefixkey.LenOf(row.key[0])]
			c := bytes.Compare(got, want)
			for c > 0 {
				// Past rows[i]'s rows, if it had any.
				if i++; i == len(rows) {
					return false
				}
				want = prefixkey.Append(keyBuf[:0], rows[i].prefix)
				c = bytes.Compare(got, want)
			}
			if c < 0 {
				// rows[i] has no row merged yet: one of its rows comes
				// after every row passed.
				passed++
				seekOn = passed > maxPassedRows
				return !seekOn
			}
			passed = 0
			p := &rows[i]
			if p.superseded {
				return true
			}
			if revision > p.changed {
				p.superseded = true
				return true
			}
			p.res.merge(row)
			return true
		}
	)
	for i < len(rows) {
		seekOn, passed = false, 0
		want = prefixkey.Append(keyBuf[:0], rows[i].prefix)
		r.metadata.LowerBound(txn, MetadataIndex.QueryFromKey(want))(visitor)
		if !seekOn {
			return // the table or the rows ended
		}
	}
}

// maxPassedRows is how many rows of other prefixes a walk of readRows
// passes before it seeks the next prefix of its chunk: a few, as a row
// passed costs a small part of a seek.
const maxPassedRows = 16

// wantedLabels is the rows' labels with the prefix's cidr label (rows
// without labels are cidrOnly): a prefix's identity carries its own cidr
// label, so that CIDR selectors find it and two prefixes never share a
// local identity, unless a row asks for a shared identity, whose labels
// hold the cidr label its owner chose.
func wantedLabels(rows labels.Labels, prefix netip.Prefix, shared bool) labels.Labels {
	switch {
	case shared:
		return rows
	case rows.IsForPrefix(prefix):
		// An owner re-asserting what restore holds, a million times at a
		// restart: no label string built.
		return rows
	}
	return rows.Union(labels.ForPrefix(prefix))
}

// cidrLabels returns the label set of the prefix's cidr label alone, for
// its entry desired (not yet written). A prefix new to the table gets a
// set holding desired's key bytes: the table keeps its first entry for as
// long as the prefix is in it (statedb keeps an index leaf's first key, and
// the entry is its own key), so a new identity's label costs no allocation
// of its own (docs/SCALE.md, "Heap, session 36"). A prefix the table holds
// gets its current labels when they are that set, else a set of its own:
// desired will not be what the table keeps.
func cidrLabels(prefix netip.Prefix, desired *Entry, current labels.Labels, hasCurrent bool) labels.Labels {
	if hasCurrent {
		if current.IsForPrefix(prefix) {
			return current
		}
		return labels.ForPrefix(prefix)
	}
	if l, ok := labels.ForPrefixKey(desired.prefix.keyString()); ok {
		return l
	}
	return labels.ForPrefix(prefix) // not a prefix key (an invalid prefix)
}

// write resolves a prefetched chunk in one write transaction, records
// its failures, and returns newFailures with the prefixes that failed for
// the first time appended. The chunk is timed from start, when the write
// began waiting for the read: a chunk's time is then what it adds to the
// round, and chunks stay at about resolveChunkTime when the read is the
// slower half (timed from the write alone, chunks grew, and a change
// waited for a larger one: docs/SCALE.md, "The resolver reads a chunk
// while the one before it is written").
func (r *resolver) write(read prefetchedChunk, start time.Time, newFailures []netip.Prefix) []netip.Prefix {
	txn := r.allocator.WriteTxn(r.entries)
	if read.whileHeld && !r.allocator.LocalHeld() {
		// Read while restore was still writing its rows, written after it
		// finished: a prefix whose restore row the read missed would take
		// a new number, and keep it. Read again: the space is released
		// under this table's lock, so it stays released.
		txn.Abort()
		again := make([]queuedPrefix, len(read.rows))
		for i, p := range read.rows {
			again[i] = queuedPrefix{compact(p.prefix), p.changed}
		}
		read = <-r.prefetch(again)
		txn = r.allocator.WriteTxn(r.entries)
	}
	chunk := read.rows
	resolved, told := 0, 0
	for i := range chunk {
		p := &chunk[i]
		if p.superseded {
			// A later change of the prefix resolves it: failed stays as
			// that one leaves it.
			continue
		}
		resolved++
		switch err := r.resolveRows(txn, p.prefix, &p.res); {
		case errors.Is(err, identitycell.ErrLocalHeld):
			// Not a failure: resolved again once the space is released,
			// or when restore's row for it comes, whichever is first.
			p.told = -1 // no entry written
			r.held[p.prefix] = struct{}{}
			r.heldTimes++
			delete(r.failed, p.prefix)
		case err != nil:
			p.told = -1 // no entry written
			if _, known := r.failed[p.prefix]; !known {
				newFailures = append(newFailures, p.prefix)
			}
			r.failed[p.prefix] = err
		default:
			delete(r.failed, p.prefix)
			if len(r.held) > 0 {
				delete(r.held, p.prefix)
			}
			if p.told >= 0 {
				told++
			}
		}
	}
	txn.Commit()
	if told > 0 {
		r.markTold(chunk)
	}
	r.resolutions += resolved
	r.adaptChunkSize(len(chunk), time.Since(start))
	// The next chunk's read reuses the slice; the labels it holds are
	// cleared so that it keeps no string alive.
	clear(chunk)
	r.spare = chunk
	return newFailures
}

// markTold marks the told prefixes of a written chunk as having an entry
// (previousNumbers): those with a place left by write, which clears it
// for the prefixes that failed or wait for the local space.
func (r *resolver) markTold(chunk []prefetched) {
	r.previous.mu.RLock()
	defer r.previous.mu.RUnlock()
	for i := range chunk {
		if t := chunk[i].told; t >= 0 && int(t) < len(r.previous.told) {
			r.previous.told[t].resolved.Store(true)
		}
	}
}

// resolveRows brings the prefix's entry in line with the merge of its
// rows.
func (r *resolver) resolveRows(txn statedb.WriteTxn, prefix netip.Prefix, res *resolution) error {
	current, currentRev, hasCurrent := r.entries.Get(txn, EntryIndex.Query(prefix))

	if !res.hasAnyMetadataRow {
		// A restored prefix keeps its entry until restore writes a row
		// for it (previousNumbers): a restored entry goes only at the
		// end of the grace period.
		if hasCurrent && !r.previous.keep(prefix) {
			if _, _, err := r.entries.Delete(txn, current); err != nil {
				return fmt.Errorf("delete ipcache entry %s: %w", prefix, err)
			}
			r.releaseHeld(txn, current)
		}
		return nil
	}

	// The labels the current entry's identity was allocated for (the
	// entry does not keep them: see Entry).
	var currentLabels labels.Labels
	if hasCurrent && !current.Explicit {
		currentLabels, _ = r.allocator.LabelsTxn(txn, current.Identity)
	}
	// The current identity's labels hold the prefix's cidr label (they
	// were allocated so, below): rows whose labels are those already are
	// what is wanted.
	wantLabels := currentLabels
	if res.labels.IsEmpty() || res.labels != currentLabels {
		wantLabels = res.want
	}
	desired := &Entry{prefix: pack(prefix), Source: res.source}
	if res.cidrOnly {
		wantLabels = cidrLabels(prefix, desired, currentLabels, hasCurrent)
	}
	switch {
	case res.explicit != identity.Unknown:
		desired.Identity, desired.Explicit = res.explicit, true
	case hasCurrent && !current.Explicit && currentLabels == wantLabels:
		// Same labels, same identity: keep the reference we hold.
		desired.Identity = current.Identity
	default:
		// Allocate the new identity before releasing the old one, so that
		// an identity both map to never drops to zero references. Except
		// when the number requested is the one the prefix holds (a
		// producer asked for it with the cidr label only, and another
		// owner's labels arrive after): then the reference is given up first, in this
		// same transaction, so that the new labels can take the number if
		// nobody else holds it, and the datapath keeps it.
		releasedFirst := hasCurrent && !current.Explicit && res.requested == current.Identity
		if releasedFirst {
			r.releaseHeld(txn, current)
		}
		id, err := r.allocator.AllocateTxn(txn, wantLabels, res.requested)
		if err == identitycell.ErrLocalHeld && !releasedFirst {
			return err // nothing changed: resolved again later (see write)
		}
		if err != nil {
			if releasedFirst {
				// Take the reference back: the number was freed in this
				// transaction, so nothing else can have taken it.
				if _, err := r.allocator.AllocateTxn(txn, currentLabels, current.Identity); err != nil {
					r.log.Error("BUG: cannot take back the identity reference of a prefix",
						"prefix", prefix, "identity", current.Identity, "error", err)
				}
			}
			return fmt.Errorf("allocate identity for %s: %w", prefix, err)
		}
		desired.Identity = id
		if releasedFirst {
			current = nil // its reference is released
			hasCurrent = false
		}
	}

	if hasCurrent && current.sameMapping(desired) {
		return nil
	}
	if hasCurrent && current.Identity == desired.Identity {
		// Only the source changed (an owner re-asserting a prefix another
		// producer holds, restore's after a restart for one): the datapath
		// maps the prefix to the identity alone, and its writer need not
		// write this entry if it wrote the current one (docs/SCALE.md,
		// restart: each entry written at most once).
		desired.unchangedSince = currentRev
	}
	if _, _, err := r.entries.Insert(txn, desired); err != nil {
		return fmt.Errorf("write ipcache entry %s: %w", prefix, err)
	}
	changed := !hasCurrent || current.Identity != desired.Identity || current.Explicit != desired.Explicit
	if desired.Explicit && changed {
		// The allocator gives a number in use as an explicit identity to
		// no label set.
		r.allocator.UseExplicitTxn(txn, desired.Identity)
	}
	if hasCurrent && changed {
		r.releaseHeld(txn, current)
	}
	return nil
}

// releaseHeld drops the reference an entry held, if it held one, or its
// use of an explicit identity.
func (r *resolver) releaseHeld(txn statedb.WriteTxn, entry *Entry) {
	if entry.Explicit {
		r.allocator.ReleaseExplicitTxn(txn, entry.Identity)
		return
	}
	if _, err := r.allocator.ReleaseTxn(txn, entry.Identity); err != nil {
		// The ipcache released only what it took: this is a bug.
		r.log.Error("BUG: ipcache released an identity reference it did not hold",
			"prefix", entry.Prefix(), "identity", entry.Identity, "error", err)
	}
}

func (r *resolver) logFailures(newFailures []netip.Prefix) {
	if len(newFailures) == 0 {
		return
	}
	examples := newFailures[:min(len(newFailures), maxLoggedFailures)]
	r.log.Warn("Cannot resolve prefixes, keeping their previous entries and retrying",
		"new-failures", len(newFailures), "failing", len(r.failed),
		"examples", examples, "error", r.failed[examples[0]])
}

func (r *resolver) reportHealth(health cell.Health) {
	if len(r.failed) == 0 {
		health.OK(fmt.Sprintf("%d prefixes resolved", r.entries.NumObjects(r.db.ReadTxn())))
		return
	}
	var errs []error
	for _, err := range r.failed {
		if errs = append(errs, err); len(errs) == maxLoggedFailures {
			break
		}
	}
	health.Degraded(fmt.Sprintf("%d prefixes cannot be resolved, retrying", len(r.failed)), errors.Join(errs...))
}
