// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// policyOps writes the `policy` table into the policy map. Updates go at
// once; a deleted key (a row deleted, or a stale key pruned) drains: it is
// deleted from the map only once nothing the map's users depend on still
// points at it (see ordering), by the drain job or by a later call.
type policyOps struct {
	ops   *mapwrite.Ops[*policy.Entry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]
	order *ordering
	log   *slog.Logger

	// mu serializes the reconciler's calls with the drain job's.
	mu sync.Mutex
	// draining are the keys to delete, with what must be written first.
	draining map[bpfmaps.PolicyKey]drainAfter
	// queued wakes the drain job (buffered, one).
	queued chan struct{}

	// anyIdentity, if set, tells the program whether the map may hold
	// identity-0 keys; anyKeys are those the map holds (nil until the
	// map is read, at the first call), told what it was last told.
	anyIdentity func(present bool) error
	anyKeys     map[bpfmaps.PolicyKey]struct{}
	told        *bool

	// guard keeps the denies that are not in the maps from failing open
	// (denyguard.go); db gives the drain job the tables to recompute it.
	guard denyGuard
	db    *statedb.DB

	// subjects, if set, takes the entries of the subjects other than 0
	// (subjects.go); ops is subject 0's map.
	subjects *subjectPolicies
}

// drainAfter is what must be written before a policy key may go: the
// `ipcache` table up to ipcache, and the switch off of every direction
// not enforced in `policy-enforcement` up to enforcement.
type drainAfter struct {
	ipcache, enforcement statedb.Revision
}

func newPolicyOps(m func() mapwrite.Map, stats *mapwrite.Stats, order *ordering, log *slog.Logger) *policyOps {
	p := &policyOps{
		order:    order,
		log:      log,
		draining: map[bpfmaps.PolicyKey]drainAfter{},
		queued:   make(chan struct{}, 1),
	}
	p.ops = &mapwrite.Ops[*policy.Entry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]{
		Name:   bpfmaps.PolicyName,
		Target: m,
		Stats:  stats,
		Log:    log,
		Key: func(e *policy.Entry) bpfmaps.PolicyKey {
			return bpfmaps.NewPolicyKey(e.Key)
		},
		Value:   func(e *policy.Entry) bpfmaps.PolicyValue { return bpfmaps.NewPolicyValue(uint32(e.Verdict)) },
		Failed:  order.policyFailed,
		Written: order.policyWritten,
	}
	return p
}

var (
	_ reconciler.Operations[*policy.Entry]      = (*policyOps)(nil)
	_ reconciler.BatchOperations[*policy.Entry] = (*policyOps)(nil)
)

// Update implements reconciler.Operations.
func (p *policyOps) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, e *policy.Entry) error {
	if p.subjects != nil && e.Key.Subject != identity.Unknown {
		batch := []reconciler.BatchEntry[*policy.Entry]{{Object: e, Revision: rev}}
		p.subjects.update(ctx, txn, batch)
		return batch[0].Result
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	key := p.ops.Key(e)
	if err := p.writingLocked(key); err != nil {
		return err
	}
	delete(p.draining, key) // wanted again: the map has it
	if p.guardedAllowLocked(key, p.ops.Value(e)) {
		// The guard holds deny there; it writes the allow once released.
		p.denyResult(key, e, nil)
		return nil
	}
	err := p.ops.Update(ctx, txn, rev, e)
	p.denyResult(key, e, err)
	p.reguardLocked(txn)
	return err
}

// UpdateBatch implements reconciler.BatchOperations.
func (p *policyOps) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*policy.Entry]) {
	p.bySubject(batch, func(subjects []reconciler.BatchEntry[*policy.Entry]) {
		p.subjects.update(ctx, txn, subjects)
	}, func(defaults []reconciler.BatchEntry[*policy.Entry]) {
		p.updateDefaultBatch(ctx, txn, defaults)
	})
}

// bySubject calls subjects with batch's entries of subjects other than 0
// and defaults with the others, and copies their results back.
func (p *policyOps) bySubject(batch []reconciler.BatchEntry[*policy.Entry], subjects, defaults func([]reconciler.BatchEntry[*policy.Entry])) {
	var from []int
	if p.subjects != nil {
		for i := range batch {
			if batch[i].Object.Key.Subject != identity.Unknown {
				from = append(from, i)
			}
		}
	}
	if len(from) == 0 {
		defaults(batch)
		return
	}
	sub := make([]reconciler.BatchEntry[*policy.Entry], 0, len(from))
	def := make([]reconciler.BatchEntry[*policy.Entry], 0, len(batch)-len(from))
	for i := range batch {
		if batch[i].Object.Key.Subject != identity.Unknown {
			sub = append(sub, batch[i])
		} else {
			def = append(def, batch[i])
		}
	}
	subjects(sub)
	if len(def) > 0 {
		defaults(def)
	}
	s, d := 0, 0
	for i := range batch {
		if batch[i].Object.Key.Subject != identity.Unknown {
			batch[i].Result = sub[s].Result
			s++
		} else {
			batch[i].Result = def[d].Result
			d++
		}
	}
}

// updateDefaultBatch writes entries of subject 0.
func (p *policyOps) updateDefaultBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*policy.Entry]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]bpfmaps.PolicyKey, len(batch))
	for i := range batch {
		keys[i] = p.ops.Key(batch[i].Object)
	}
	if err := p.writingLocked(keys...); err != nil {
		for i := range batch {
			batch[i].Result = err
		}
		return
	}
	if len(p.draining) > 0 {
		for _, k := range keys {
			delete(p.draining, k)
		}
	}
	// Deny entries first: the allows of a batch do not take the room its
	// denies need. Allows the guard holds as deny wait for its release.
	write := make([]reconciler.BatchEntry[*policy.Entry], 0, len(batch))
	from := make([]int, 0, len(batch))
	for pass := range 2 {
		for i := range batch {
			deny := batch[i].Object.Verdict == policy.VerdictDeny
			if deny != (pass == 0) {
				continue
			}
			if p.guardedAllowLocked(keys[i], p.ops.Value(batch[i].Object)) {
				p.denyResult(keys[i], batch[i].Object, nil)
				continue
			}
			write, from = append(write, batch[i]), append(from, i)
		}
	}
	p.ops.UpdateBatch(ctx, txn, write)
	for j, i := range from {
		batch[i].Result = write[j].Result
		p.denyResult(keys[i], batch[i].Object, write[j].Result)
	}
	p.reguardLocked(txn)
}

// writingLocked is called before keys are written: the program is told
// of identity-0 keys before the first is in the map, so that it never
// skips a lookup that could find one.
//
// Possible errors: the map cannot be read (the first time), or the
// program cannot be told.
func (p *policyOps) writingLocked(keys ...bpfmaps.PolicyKey) error {
	if err := p.readAnyKeysLocked(); err != nil {
		return err
	}
	for _, k := range keys {
		if id, _, _, _ := k.Fields(); id == 0 {
			p.anyKeys[k] = struct{}{}
		}
	}
	return p.tellLocked()
}

// deletedLocked is called after keys were deleted: once the map holds no
// identity-0 key, the program may skip that lookup.
func (p *policyOps) deletedLocked(keys []bpfmaps.PolicyKey) {
	if p.anyKeys == nil {
		return
	}
	for _, k := range keys {
		delete(p.anyKeys, k)
	}
	if err := p.tellLocked(); err != nil {
		p.log.Error("Cannot tell the program that the policy map holds no identity-0 entry; it keeps looking them up", "error", err)
	}
}

// readAnyKeysLocked reads, once, the identity-0 keys the map holds (a
// previous run's).
func (p *policyOps) readAnyKeysLocked() error {
	if p.anyIdentity == nil || p.anyKeys != nil {
		return nil
	}
	keys := map[bpfmaps.PolicyKey]struct{}{}
	err := bpfmaps.ReadEntries(p.ops.Target(), func(k bpfmaps.PolicyKey, _ bpfmaps.PolicyValue) {
		if id, _, _, _ := k.Fields(); id == 0 {
			keys[k] = struct{}{}
		}
	})
	if err != nil {
		return fmt.Errorf("read the identity-0 keys of the %s map: %w", bpfmaps.PolicyName, err)
	}
	p.anyKeys = keys
	return nil
}

// tellLocked tells the program whether the map holds identity-0 keys, if
// that changed.
func (p *policyOps) tellLocked() error {
	if p.anyIdentity == nil || p.anyKeys == nil {
		return nil
	}
	present := len(p.anyKeys) > 0
	if p.told != nil && *p.told == present {
		return nil
	}
	if err := p.anyIdentity(present); err != nil {
		return err
	}
	p.told = &present
	return nil
}

// Delete implements reconciler.Operations: the key drains.
func (p *policyOps) Delete(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, e *policy.Entry) error {
	if p.subjects != nil && e.Key.Subject != identity.Unknown {
		p.subjects.remove(txn, []*policy.Entry{e})
		p.wakeDrain()
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainLocked(txn, []bpfmaps.PolicyKey{p.ops.Key(e)})
	p.reguardLocked(txn)
	return nil
}

// DeleteBatch implements reconciler.BatchOperations: the keys drain.
func (p *policyOps) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*policy.Entry]) {
	p.bySubject(batch, func(subjects []reconciler.BatchEntry[*policy.Entry]) {
		entries := make([]*policy.Entry, len(subjects))
		for i := range subjects {
			entries[i] = subjects[i].Object
		}
		p.subjects.remove(txn, entries)
		p.wakeDrain()
	}, func(defaults []reconciler.BatchEntry[*policy.Entry]) {
		p.deleteDefaultBatch(ctx, txn, defaults)
	})
}

// wakeDrain wakes the drain job.
func (p *policyOps) wakeDrain() {
	select {
	case p.queued <- struct{}{}:
	default:
	}
}

// deleteDefaultBatch drains keys of subject 0.
func (p *policyOps) deleteDefaultBatch(_ context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*policy.Entry]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]bpfmaps.PolicyKey, len(batch))
	for i := range batch {
		keys[i] = p.ops.Key(batch[i].Object)
	}
	p.drainLocked(txn, keys)
	p.reguardLocked(txn)
}

// Prune implements reconciler.Operations: the stale keys drain.
func (p *policyOps) Prune(_ context.Context, txn statedb.ReadTxn, objects iter.Seq2[*policy.Entry, statedb.Revision]) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.readAnyKeysLocked(); err != nil {
		return err
	}
	if p.subjects != nil {
		// Each subject's map has its own keys.
		var subjects []*policy.Entry
		for e := range objects {
			if e.Key.Subject != identity.Unknown {
				subjects = append(subjects, e)
			}
		}
		if err := p.subjects.prune(subjects); err != nil {
			return err
		}
		all := objects
		objects = func(yield func(*policy.Entry, statedb.Revision) bool) {
			for e, rev := range all {
				if e.Key.Subject == identity.Unknown && !yield(e, rev) {
					return
				}
			}
		}
	}
	stale, err := p.ops.StaleKeys(objects)
	if err != nil {
		return err
	}
	// The guard's shadows have no row; it deletes them itself.
	stale = slices.DeleteFunc(stale, func(k bpfmaps.PolicyKey) bool { return p.guard.guarded[k] == guardShadow })
	p.drainLocked(txn, stale)
	p.reguardLocked(txn)
	p.ops.Stats.Prunes.Add(1)
	// What the map holds is known now (the first prune may write
	// nothing): the program may skip identity-0 lookups if it has none.
	return p.tellLocked()
}

// drainLocked queues keys to delete once the tables as txn has them are
// written, and deletes at once those that may go.
func (p *policyOps) drainLocked(txn statedb.ReadTxn, keys []bpfmaps.PolicyKey) {
	after := drainAfter{ipcache: p.order.ipcache.Revision(txn), enforcement: p.order.enforcement.Revision(txn)}
	for _, k := range keys {
		p.order.policyWritten(k) // no longer wanted: not a missing entry
		delete(p.guard.failedDenies, k)
		if _, ok := p.draining[k]; !ok {
			p.draining[k] = after
		}
	}
	if left, _, _ := p.deleteDrainedLocked(); left > 0 {
		select {
		case p.queued <- struct{}{}:
		default:
		}
	}
}

// deleteDrainedLocked deletes the draining keys that may go now. It
// returns how many are left and, if some wait for a revision (not only for
// a held ipcache key), the oldest revisions they wait for.
func (p *policyOps) deleteDrainedLocked() (left int, wait drainAfter, revisions bool) {
	if len(p.draining) == 0 {
		return 0, wait, false
	}
	ipcacheWritten := written(p.order.ipcacheWriter)
	switchedOff, _ := p.order.switchedOff.Get()
	var ready []bpfmaps.PolicyKey
	for k, after := range p.draining {
		if after.ipcache > ipcacheWritten || after.enforcement > switchedOff {
			if !revisions || after.ipcache < wait.ipcache {
				wait.ipcache = after.ipcache
			}
			if !revisions || after.enforcement < wait.enforcement {
				wait.enforcement = after.enforcement
			}
			revisions = true
			continue
		}
		id, _, _, _ := k.Fields()
		if held, _ := p.order.heldIdentity(id); held {
			continue
		}
		ready = append(ready, k)
	}
	for _, k := range ready {
		delete(p.draining, k)
	}
	if err := p.ops.DeleteKeys(ready); err != nil {
		// The keys have no row: the next prune finds them again.
		p.log.Error("Cannot delete policy map entries; the next prune retries", "error", err)
	} else {
		p.deletedLocked(ready)
	}
	return len(p.draining), wait, revisions
}

// drain is the job that deletes the draining keys as they may go.
func (p *policyOps) drain(ctx context.Context, _ cell.Health) error {
	for {
		// Taken before the keys are looked at: a held key written after
		// it closes it, as a change of the subjects' users does.
		_, heldGone := p.order.heldIdentity(0)
		usesChanged := p.order.uses.wait()
		p.mu.Lock()
		left, after, revisions := p.deleteDrainedLocked()
		if p.subjects != nil {
			// A subject's keys wait for the same writers' progress, or
			// for its endpoints to go (uses).
			n, wait, waits := p.subjects.drainRound()
			left += n
			switch {
			case waits && !revisions:
				after, revisions = wait, true
			case waits:
				after = drainAfter{ipcache: min(after.ipcache, wait.ipcache), enforcement: min(after.enforcement, wait.enforcement)}
			}
		}
		if p.db != nil && p.guardActiveLocked() {
			// A deleted key may have been what a denied packet met.
			p.reguardLocked(p.db.ReadTxn())
		}
		p.mu.Unlock()
		if left == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-p.queued:
			}
			continue
		}
		reached := make(chan struct{})
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(reached)
			if !revisions {
				<-wctx.Done() // only held keys: woken by heldGone
				return
			}
			if _, _, err := p.order.ipcacheWriter.WaitUntilReconciled(wctx, after.ipcache); err != nil {
				return
			}
			p.order.switchedOff.Wait(wctx, func(rev statedb.Revision) bool { return rev >= after.enforcement })
		}()
		select {
		case <-ctx.Done():
		case <-reached:
		case <-heldGone:
		case <-usesChanged:
		case <-p.queued:
		}
		cancel()
		<-reached
		if ctx.Err() != nil {
			return nil
		}
	}
}

// numDraining returns the number of keys waiting to be deleted.
func (p *policyOps) numDraining() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.draining)
}
