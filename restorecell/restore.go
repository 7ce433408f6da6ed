// SPDX-License-Identifier: Apache-2.0

package restorecell

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"golang.org/x/time/rate"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// Resource is the name of restore's resource handle in the ipcache.
const Resource = "restore"

// healthInterval is how often the health status (time left, prefixes still
// held only by restore) is refreshed during the grace period.
const healthInterval = 5 * time.Second

// releaseRate is how many restored prefixes a second are released once the
// grace period is over. Paced, statedb's graveyard collector (one write
// transaction a second) never has so many dead rows to remove that an
// unrelated upsert waits long for it; released at full speed, it had
// (docs/SCALE.md, "Figures behind choices in identitycell and
// restorecell"). Nothing waits for the release: the prefixes are stale,
// and their numbers stay withheld until it is done, then are returned to
// use at the same rate.
const releaseRate = 20_000

// restoreBatchSize is how many restored prefixes are withheld and
// upserted at a time, at least: the pinned map is read a few thousand
// entries at a time, and a withhold per block waited for the resolver's
// chunk as many times (docs/SCALE.md, "The restart overlaps restore").
const restoreBatchSize = 1 << 16

// unwithholdChunkSize is how many numbers are returned to use in one
// transaction of the identities table, once the release is done: small
// enough that the resolver, which writes the same table, never waits long.
const unwithholdChunkSize = 1024

// pinned and checkpoint are what the previous run left behind. The
// pinned map's entries come as the datapath reads them, after its start
// hook; the checkpoint waits until its cell's start hook has read it.
type checkpoint interface {
	Previous(context.Context) (identitycell.Checkpoint, error)
	ForgetPrevious()
}

// Restorer restores the previous run's prefixes and releases them after the
// grace period.
type Restorer struct {
	cfg        Config
	log        *slog.Logger
	db         *statedb.DB
	metadata   statedb.Table[*ipcachecell.PrefixMetadata]
	entries    statedb.Table[*ipcachecell.Entry]
	pinned     bpfmaps.PinnedIPCache
	checkpoint checkpoint
	allocator  *identitycell.Allocator
	ipcache    *ipcachecell.IPCache

	restorerDone func()
	// rowsMu orders the rows restore writes after its start (writeRows)
	// with the release: forgotten is set, under it, once the ipcache no
	// longer keeps restored entries (IPCache.ForgetPrevious).
	rowsMu    sync.Mutex
	forgotten bool
	// releaseLocal releases the allocator's local space, held until every
	// restored number is withheld.
	releaseLocal func()

	// restoredCh is closed once the prefixes are restored: the grace
	// period has started, and the release job may wait for its end.
	restoredCh chan struct{}

	mu        sync.Mutex
	handle    *ipcachecell.Handle
	withheld  []identity.Number
	restored  int
	startedAt time.Time // when restore was marked done: the grace period starts
	releasing bool      // the grace period is over, the release under way
	released  bool
	releaseAt time.Time
}

// Start implements cell.HookInterface. It waits, with the hook's
// context, for the previous checkpoint (decoded by the time it runs or
// soon after) and withholds its label identities for the label sets that
// had them: the endpoint cell allocates those directly, from its own
// start on, so they must be withheld before any start hook after this
// one. The pinned map's prefixes are restored by the job that follows
// (restorePinned): until it is done, the allocator hands out no local
// number that restore has not withheld (registerRestorer).
//
// Possible errors: ctx's, wrapped by Checkpointer.Previous; those of
// identitycell.Allocator.WithholdForLabels and
// ipcachecell.IPCache.NewHandle (wrapped). Each fails the start.
func (r *Restorer) Start(ctx cell.HookContext) error {
	saved, err := r.checkpoint.Previous(ctx)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	handle, err := r.ipcache.NewHandle(Resource, source.Restored)
	if err != nil {
		return fmt.Errorf("create restore handle: %w", err)
	}
	// Label identities are not in the pinned map as such (their prefixes
	// are endpoints', which the endpoint sources re-create): their numbers
	// are withheld for the label sets that had them, which get them back
	// when they ask for an identity, before anything is allocated.
	withheld, err := r.allocator.WithholdForLabels(saved.All())
	if err != nil {
		return fmt.Errorf("withhold restored label identities: %w", err)
	}
	r.mu.Lock()
	r.handle, r.withheld = handle, withheld
	r.mu.Unlock()
	return nil
}

// restorePinned restores the pinned map's prefixes, several blocks at a
// time as the datapath reads the map (what is read is told while the
// kernel reads the next blocks), then releases the allocator's local
// space. It is a job, not part of the start hook, so that owners
// re-assert their prefixes, and the resolver resolves them, while the
// kernel reads the map (docs/SCALE.md, "The restart overlaps restore").
//
// A prefix whose identity was its cidr label alone, nearly all of them,
// gets no row: its number is withheld and told to the ipcache
// (IPCache.AddPrevious), which requests it for the prefix's rows as a
// row of restore's did (docs/SCALE.md, "What restore's rows cost the
// restart"). Restore speaks for such a prefix only once every other
// producer has spoken and been resolved, and only if none re-asserted it
// (IPCache.PreviousWithoutEntry); then it marks itself done: the grace
// period starts.
//
// Possible errors: the pinned map cannot be read (the datapath's start
// leaves that error to restore); those of identitycell.Allocator.Withhold
// and ipcachecell.Handle.UpsertBatch (wrapped). Each shuts the agent
// down (job.WithShutdown): an agent that cannot restore must not resolve.
func (r *Restorer) restorePinned(ctx context.Context, health cell.Health) error {
	// Decoded by the time the start hook returned: the Checkpointer keeps
	// it for this job, which then drops it.
	saved, err := r.checkpoint.Previous(ctx)
	if err != nil {
		return nil // stopping: the next run restores again
	}
	r.mu.Lock()
	handle, withheld := r.handle, r.withheld
	r.mu.Unlock()
	labelIdentities := len(withheld) // withheld by the start hook
	var (
		// rows are the prefixes whose identity had more labels than the
		// prefix's cidr label; numbers the others. Both reused.
		rows     []ipcachecell.PrefixUpsert
		numbers  []ipcachecell.PreviousNumber
		first    = len(withheld) // of withheld, the batch's first number
		skipped  int
		restored int
	)
	// flush withholds the batch's numbers, then tells them.
	flush := func() error {
		// Withheld before they are told: a prefix is resolved with its
		// old number only once that is withheld for it (the allocator's
		// local space is held until all are: registerRestorer).
		if err := r.allocator.Withhold(withheld[first:]...); err != nil {
			return fmt.Errorf("withhold %d restored numbers: %w", len(withheld)-first, err)
		}
		if len(rows) > 0 {
			if err := handle.UpsertBatch(rows); err != nil {
				return fmt.Errorf("restore %d prefixes: %w", len(rows), err)
			}
		}
		r.ipcache.AddPrevious(numbers)
		rows, numbers, first = rows[:0], numbers[:0], len(withheld)
		return nil
	}
	for block, err := range r.pinned.Blocks(ctx) {
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopping: the next run restores again
			}
			return fmt.Errorf("restore: %w", err)
		}
		for _, entry := range block {
			prefix, id := entry.Prefix, entry.Identity
			if !id.IsLocal() {
				// Reserved, explicit, or a label identity's (withheld
				// at start): its owner re-asserts it, or it goes.
				skipped++
				continue
			}
			lbls, checkpointed := saved.Labels(id)
			// Nearly always the cidr label alone: told without building
			// it. A shared identity's labels (the addresses learned from
			// DNS: ipcachecell.SharedIdentity) name a prefix covering it.
			if checkpointed && !lbls.IsForPrefix(prefix) && !lbls.Has(labels.CIDRLabel(prefix)) && !covers(lbls, prefix) {
				r.log.Warn("Checkpointed labels of a restored identity do not name its prefix; using the cidr label",
					"prefix", prefix, "identity", id, "checkpoint-labels", lbls)
				checkpointed = false
			}
			if checkpointed && !lbls.IsForPrefix(prefix) {
				md := ipcachecell.Metadata{RequestedIdentity: id, Labels: lbls}
				rows = append(rows, ipcachecell.PrefixUpsert{Prefix: prefix, Metadata: md})
			} else {
				numbers = append(numbers, ipcachecell.PreviousNumber{Prefix: prefix, Number: id})
			}
			withheld = append(withheld, id)
			restored++
		}
		// Several blocks at a time: a Withhold takes the identities
		// table's lock, which the resolver holds for one chunk after
		// another while it resolves what owners re-asserted meanwhile.
		if len(rows)+len(numbers) >= restoreBatchSize {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	r.mu.Lock()
	r.withheld = withheld
	r.mu.Unlock()
	// Restore needs no more of the previous run's labels: those it uses
	// are in its rows. Kept, they would be heap the agent holds for as
	// long as it runs (docs/SCALE.md, "What a restart keeps").
	r.checkpoint.ForgetPrevious()
	r.releaseLocal()

	// Restore speaks last, for what nobody else re-asserted: the other
	// producers do not wait for restore (the local space is released), so
	// this waits for nothing that waits for it.
	health.OK(fmt.Sprintf("Pinned map read (%d prefixes restored): waiting for the other producers", restored))
	if err := r.ipcache.WaitOtherProducers(ctx, Resource); err != nil {
		return nil // stopping: the next run restores again
	}
	if err := r.ipcache.WaitResolved(ctx); err != nil {
		return nil
	}
	missing := r.ipcache.PreviousWithoutEntry()
	if err := r.writeRows(missing); err != nil {
		return err
	}

	r.mu.Lock()
	r.restored = restored
	r.startedAt = time.Now()
	r.releaseAt = r.startedAt.Add(r.cfg.IdentityRestoreGracePeriod)
	r.mu.Unlock()
	close(r.restoredCh)
	r.restorerDone()
	r.log.Info("Restored prefixes from the pinned ipcache map",
		"restored", restored, "not-re-asserted", len(missing), "not-restored-non-local", skipped,
		"checkpointed-identities", saved.Len(), "withheld-label-identities", labelIdentities,
		"grace-period", r.cfg.IdentityRestoreGracePeriod)
	return nil
}

// writeRows writes a row of restore's for each prefix, with its previous
// number: the prefixes nobody re-asserted, or whose rows went. Under
// rowsMu: once the release has started (forgotten), it writes nothing.
//
// Possible errors: those of ipcachecell.Handle.UpsertBatch (wrapped).
func (r *Restorer) writeRows(prefixes []ipcachecell.PreviousNumber) error {
	r.rowsMu.Lock()
	defer r.rowsMu.Unlock()
	if r.forgotten {
		return nil
	}
	return r.writeRowsLocked(prefixes)
}

// writeRowsLocked is writeRows with rowsMu held, whatever forgotten says.
func (r *Restorer) writeRowsLocked(prefixes []ipcachecell.PreviousNumber) error {
	if len(prefixes) == 0 {
		return nil
	}
	rows := make([]ipcachecell.PrefixUpsert, len(prefixes))
	for i, p := range prefixes {
		rows[i] = ipcachecell.PrefixUpsert{Prefix: p.Prefix, Metadata: ipcachecell.Metadata{RequestedIdentity: p.Number}}
	}
	if err := r.handle.UpsertBatch(rows); err != nil {
		return fmt.Errorf("restore %d prefixes: %w", len(rows), err)
	}
	return nil
}

// writeOrphans writes a row of restore's for each restored prefix whose
// last row went during the grace period (ipcachecell.IPCache.Orphans):
// the resolver kept its entry until then.
//
// Possible errors: those of writeRows. It shuts the agent down: an entry
// kept without a row would otherwise stay after the grace period.
func (r *Restorer) writeOrphans(ctx context.Context, _ cell.Health) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.ipcache.Orphans():
		}
		r.rowsMu.Lock()
		if r.forgotten {
			r.rowsMu.Unlock()
			return nil
		}
		err := r.writeRowsLocked(r.ipcache.TakeOrphans())
		r.rowsMu.Unlock()
		if err != nil {
			return err
		}
	}
}

// Stop implements cell.HookInterface: nothing is released, the next run
// restores again from what is pinned.
//
// Possible errors: none.
func (r *Restorer) Stop(cell.HookContext) error { return nil }

// releaseAfterGracePeriod waits for restore, the grace period and until
// every owner has re-asserted its prefixes (the `ipcache` table is
// initialized), then releases the restore handle and un-withholds the
// numbers. Stopping first releases nothing: the next run restores again
// from what is pinned.
func (r *Restorer) releaseAfterGracePeriod(ctx context.Context, health cell.Health) error {
	select {
	case <-ctx.Done():
		return nil
	case <-r.restoredCh:
	}
	ticker := time.NewTicker(healthInterval)
	defer ticker.Stop()
	for {
		// Without the count of prefixes held only by restore, which
		// costs a pass over all metadata: restore/status has it.
		status := r.status(nil)
		if status.TimeLeft <= 0 {
			break
		}
		health.OK(fmt.Sprintf("%d restored, %s left", status.Restored, status.TimeLeft.Round(time.Second)))
		timer := time.NewTimer(status.TimeLeft)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-ticker.C:
		case <-timer.C:
		}
		timer.Stop()
	}

	// The grace period is over, but an owner that has not re-asserted its
	// prefixes yet (a policy directory read late, a volume mounted late)
	// would find them released, deleted from the map and renumbered. The
	// `ipcache` table is initialized once every producer has spoken.
	if _, initialized := r.entries.Initialized(r.db.ReadTxn()); !isClosed(initialized) {
		r.log.Info("Restore grace period over, but not every owner has re-asserted its prefixes yet: " +
			"keeping the restored prefixes until the ipcache table is initialized")
		health.OK("Grace period over; waiting for every owner before releasing")
		select {
		case <-ctx.Done():
			return nil
		case <-initialized:
		}
	}

	status := r.Status()
	r.mu.Lock()
	handle := r.handle
	r.releasing = handle != nil
	r.mu.Unlock()
	if handle == nil {
		return nil // restore never ran (start failed)
	}
	// From here on the ipcache keeps no entry for restore: the prefixes
	// whose rows went and that it kept get theirs now, and go with the
	// rest.
	r.rowsMu.Lock()
	r.forgotten = true
	err := r.writeRowsLocked(r.ipcache.ForgetPrevious())
	r.rowsMu.Unlock()
	if err != nil {
		health.Degraded("Cannot write the rows of restored prefixes", err)
		return fmt.Errorf("release restored prefixes: %w", err)
	}
	r.log.Info("Restore grace period over: releasing restored prefixes",
		"restored", status.Restored, "held-only-by-restore", status.HeldOnlyByRestore, "prefixes-per-second", releaseRate)
	health.OK(fmt.Sprintf("Grace period over: releasing %d restored prefixes", status.Restored))
	if err := handle.ReleaseGradually(ctx, releaseRate); err != nil {
		if ctx.Err() != nil {
			return nil // stopping: the next run restores again
		}
		health.Degraded("Cannot release restored prefixes", err)
		return fmt.Errorf("release restored prefixes: %w", err)
	}
	if err := r.unwithholdGradually(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopping: the next run restores again
		}
		health.Degraded("Cannot return the restored numbers to use", err)
		return fmt.Errorf("unwithhold restored numbers: %w", err)
	}
	r.mu.Lock()
	r.released, r.releasing = true, false
	r.mu.Unlock()
	r.log.Info("Restore grace period over: released restored prefixes",
		"restored", status.Restored, "released-unowned", status.HeldOnlyByRestore,
		"kept-by-other-owners", status.Restored-status.HeldOnlyByRestore)
	health.OK(fmt.Sprintf("Grace period over: released %d restored prefixes, %d had no other owner",
		status.Restored, status.HeldOnlyByRestore))
	return nil
}

// unwithholdGradually returns the withheld numbers to general use, paced
// as the release is: each number still allocated has its row rewritten
// (without the mark), one more dead row for statedb's graveyard collector,
// and a change the policy selectors then look at again.
func (r *Restorer) unwithholdGradually(ctx context.Context) error {
	limiter := rate.NewLimiter(releaseRate, unwithholdChunkSize)
	for start := 0; start < len(r.withheld); start += unwithholdChunkSize {
		chunk := r.withheld[start:min(start+unwithholdChunkSize, len(r.withheld))]
		if err := limiter.WaitN(ctx, len(chunk)); err != nil {
			return err
		}
		if err := r.allocator.Unwithhold(chunk...); err != nil {
			return err
		}
	}
	return nil
}

// Restored returns a channel closed once the pinned map's prefixes are
// restored (restorePinned): the grace period has started.
func (r *Restorer) Restored() <-chan struct{} { return r.restoredCh }

// Status is the restore's progress.
type Status struct {
	// Restoring is set from the start until the pinned map's prefixes
	// are restored; Restored and TimeLeft are 0 until then.
	Restoring         bool
	Restored          int           // prefixes restored from the pinned map
	HeldOnlyByRestore int           // restored prefixes no other owner has re-asserted
	TimeLeft          time.Duration // until release; 0 once released
	// Withheld is how many numbers the allocator withholds: the restored
	// ones until they are returned to use, after the release.
	Withheld int
	// Releasing is set while the restored prefixes are being released
	// (at releaseRate, so a million take most of a minute); Released once
	// they all are.
	Releasing bool
	Released  bool
}

// String summarizes the status in one line (as health shows it).
func (s Status) String() string {
	if s.Restoring {
		return "restoring the pinned ipcache map's prefixes"
	}
	if s.Released {
		return fmt.Sprintf("released %d restored prefixes", s.Restored)
	}
	if s.Releasing {
		return fmt.Sprintf("releasing %d restored prefixes, %d still held only by restore", s.Restored, s.HeldOnlyByRestore)
	}
	return fmt.Sprintf("%d restored, %d held only by restore, %s left",
		s.Restored, s.HeldOnlyByRestore, s.TimeLeft.Round(time.Second))
}

// Status returns the restore's progress.
func (r *Restorer) Status() Status { return r.status(r.heldOnlyByRestore) }

// status returns the restore's progress, with countHeld's count of the
// prefixes held only by restore while they are not released (nil: 0).
func (r *Restorer) status(countHeld func(statedb.ReadTxn) int) Status {
	r.mu.Lock()
	status := Status{Restoring: !isClosed(r.restoredCh), Restored: r.restored,
		Releasing: r.releasing, Released: r.released, Withheld: r.allocator.NumWithheld()}
	if !r.released && !r.releaseAt.IsZero() {
		status.TimeLeft = max(time.Until(r.releaseAt), 0)
	}
	handle := r.handle
	r.mu.Unlock()
	// The release is gradual; once its last chunk is gone, it is over as
	// far as anyone can see (only un-withholding the numbers is left): the
	// status says released as soon as the handle has no row left.
	if status.Releasing && handle.NumPrefixes() == 0 {
		status.Releasing, status.Released = false, true
	}
	// Without a restored row, no prefix is held by restore alone: no
	// walk of the metadata (an agent that restored nothing, or whose
	// release is over, has all of it to walk).
	if !status.Released && countHeld != nil && handle != nil && handle.NumPrefixes() > 0 {
		status.HeldOnlyByRestore = countHeld(r.db.ReadTxn())
	}
	return status
}

// heldOnlyByRestore counts the restored prefixes that have no other owner:
// one pass over the metadata in key order, where the rows of a prefix are
// adjacent (a query per restored prefix costs several times more at a
// million prefixes).
func (r *Restorer) heldOnlyByRestore(txn statedb.ReadTxn) int {
	var (
		n          int
		current    netip.Prefix
		rows       int
		hasRestore bool
	)
	count := func() {
		if rows == 1 && hasRestore {
			n++
		}
	}
	for row := range r.metadata.All(txn) {
		if row.Prefix() != current || rows == 0 {
			count()
			current, rows, hasRestore = row.Prefix(), 0, false
		}
		rows++
		hasRestore = hasRestore || row.Resource() == Resource
	}
	count()
	return n
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// covers reports whether one of the cidr labels of lbls names a prefix
// that holds prefix.
func covers(lbls labels.Labels, prefix netip.Prefix) bool {
	for p := range lbls.Prefixes() {
		if p.Bits() <= prefix.Bits() && p.Contains(prefix.Addr()) {
			return true
		}
	}
	return false
}
