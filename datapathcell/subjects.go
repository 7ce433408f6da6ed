// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// innerPolicy is a subject's policy map (an LPM trie of the policy map's
// layout): the map its entries are written to, and what the outer policy
// map stores for it.
type innerPolicy struct {
	// write is the map the writers write (each write bumps the revision).
	write mapwrite.Map
	// handle is the outer map's value for it: the *ebpf.Map (the kernel
	// takes its descriptor), or a test's fake.
	handle any
	// close releases this process's descriptor; the map lives on while
	// the outer map holds it.
	close func() error
}

// subjectPolicies writes the policy entries of the subjects other than 0
// (the identities of local endpoints; subject 0's entries are the policy
// writer's own map) into one inner map per subject, and keeps the inner
// maps' lifetimes in the order make before break needs:
//
//   - an inner map is created and filled, and inserted into the outer map
//     only when the endpoints writer is about to point an endpoint at its
//     subject (use): by then the policy writer has written every entry
//     the selectors computed for the subject (the endpoints writer waits
//     for that), so the program never sees a half-filled policy for a
//     subject that had none;
//   - it leaves the outer map (release) only once no endpoints map entry
//     points at the subject, the subject has no enforcement map entry
//     left, and the `policy` table has no row of it;
//   - the number of subjects is bounded (max): the rows of a subject
//     beyond it fail with ErrTooManySubjects, which their status shows
//     and the reconciler retries, and its endpoints are held back.
//
// A key of a subject whose map is in the outer map drains as the
// default's keys do (policyOps) while the subject has endpoints (a policy
// edit); one of a subject that has none in the table any more (its
// endpoints went or moved to another identity) waits until no endpoints
// map entry points at it; one of a subject no endpoint uses goes at once,
// since the program cannot reach it.
type subjectPolicies struct {
	log   *slog.Logger
	stats *mapwrite.Stats
	order *ordering
	// max is the most subjects besides 0 with an inner map.
	max int
	// outer is the outer policy map, keyed by subject (u32).
	outer func() mapwrite.Map
	// create makes an empty inner map.
	create func() (innerPolicy, error)
	// pinned returns the inner maps the outer map holds from a previous
	// run, by subject (nil: none); called once, at the first use.
	pinned func() (map[identity.Number]innerPolicy, error)
	// hasEndpoints reports whether the `endpoints` table has a local
	// endpoint of the subject now (nil: none).
	hasEndpoints func(identity.Number) bool

	mu       sync.Mutex
	subjects map[identity.Number]*subjectPolicy
	// read is set once pinned was read.
	read bool
	// failedChanged is closed when a subject's failed denies change
	// (failClosed).
	failedChanged chan struct{}
}

// subjectPolicy is one subject's inner map and what is written to it.
type subjectPolicy struct {
	inner innerPolicy
	ops   *mapwrite.Ops[*policy.Entry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]
	// inOuter: the outer map holds the inner map.
	inOuter bool
	// wanted are the keys whose rows are in the `policy` table.
	wanted map[bpfmaps.PolicyKey]struct{}
	// unwritten are the wanted keys whose last write failed.
	unwritten map[bpfmaps.PolicyKey]struct{}
	// failedDenies are the unwritten keys of deny rows, with their
	// direction: while the subject's endpoints use the map, that
	// direction drops everything (failClosed).
	failedDenies map[bpfmaps.PolicyKey]policy.Direction
	// draining are the keys to delete once the maps' users no longer
	// need them (see drainAfter).
	draining map[bpfmaps.PolicyKey]drainAfter
}

func newSubjectPolicies(log *slog.Logger, stats *mapwrite.Stats, order *ordering, max int) *subjectPolicies {
	return &subjectPolicies{log: log, stats: stats, order: order, max: max, subjects: map[identity.Number]*subjectPolicy{}}
}

// readPinnedLocked takes over the previous run's inner maps, once: their
// subjects keep their maps (a restart writes no unchanged entry: each
// map's writes skip the values it holds) until released.
func (s *subjectPolicies) readPinnedLocked() error {
	if s.read || s.pinned == nil {
		s.read = true
		return nil
	}
	pinned, err := s.pinned()
	if err != nil {
		return fmt.Errorf("read the subjects of the outer %s map: %w", bpfmaps.PolicyName, err)
	}
	s.read = true
	for id, inner := range pinned {
		sp := s.newSubjectLocked(id, inner)
		sp.inOuter = true
	}
	return nil
}

func (s *subjectPolicies) newSubjectLocked(id identity.Number, inner innerPolicy) *subjectPolicy {
	sp := &subjectPolicy{
		inner:     inner,
		inOuter:   false,
		wanted:    map[bpfmaps.PolicyKey]struct{}{},
		unwritten: map[bpfmaps.PolicyKey]struct{}{},
		draining:  map[bpfmaps.PolicyKey]drainAfter{},

		failedDenies: map[bpfmaps.PolicyKey]policy.Direction{},
	}
	sp.ops = &mapwrite.Ops[*policy.Entry, bpfmaps.PolicyKey, bpfmaps.PolicyValue]{
		Name:   bpfmaps.PolicyName,
		Target: func() mapwrite.Map { return sp.inner.write },
		Stats:  s.stats,
		Log:    s.log,
		Key:    func(e *policy.Entry) bpfmaps.PolicyKey { return bpfmaps.NewPolicyKey(e.Key) },
		Value:  func(e *policy.Entry) bpfmaps.PolicyValue { return bpfmaps.NewPolicyValue(uint32(e.Verdict)) },
		Failed: func(k bpfmaps.PolicyKey) { sp.unwritten[k] = struct{}{} },
		Written: func(k bpfmaps.PolicyKey) {
			delete(sp.unwritten, k)
			s.clearFailedDenyLocked(sp, k)
		},
	}
	s.subjects[id] = sp
	return sp
}

// getLocked returns the subject's inner map, made if it has none.
//
// Possible errors: ErrTooManySubjects (wrapped); the map cannot be made.
func (s *subjectPolicies) getLocked(id identity.Number) (*subjectPolicy, error) {
	if err := s.readPinnedLocked(); err != nil {
		return nil, err
	}
	if sp, ok := s.subjects[id]; ok {
		return sp, nil
	}
	if len(s.subjects) >= s.max {
		return nil, fmt.Errorf("%w: subject %d would be one more than %d", ErrTooManySubjects, id, s.max)
	}
	inner, err := s.create()
	if err != nil {
		return nil, fmt.Errorf("create the policy map of subject %d: %w", id, err)
	}
	return s.newSubjectLocked(id, inner), nil
}

// update writes the entries of batch (every one of a subject other than
// 0) into their subjects' maps, setting each entry's Result.
func (s *subjectPolicies) update(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*policy.Entry]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bySubject := map[identity.Number][]int{}
	for i := range batch {
		id := batch[i].Object.Key.Subject
		bySubject[id] = append(bySubject[id], i)
	}
	for id, indexes := range bySubject {
		sp, err := s.getLocked(id)
		if err != nil {
			for _, i := range indexes {
				batch[i].Result = err
			}
			continue
		}
		sub := make([]reconciler.BatchEntry[*policy.Entry], len(indexes))
		for j, i := range indexes {
			sub[j] = batch[i]
			k := sp.ops.Key(batch[i].Object)
			sp.wanted[k] = struct{}{}
			delete(sp.draining, k) // wanted again: the map has it
		}
		sp.ops.UpdateBatch(ctx, txn, sub)
		for j, i := range indexes {
			batch[i].Result = sub[j].Result
			if e := batch[i].Object; sub[j].Result != nil && e.Verdict == policy.VerdictDeny {
				sp.failedDenies[sp.ops.Key(e)] = e.Key.Direction
				s.failedChangedLocked()
			}
		}
	}
}

// remove drains the keys of entries (of subjects other than 0) whose
// rows went, or stale keys (prune): see subjectPolicies.
func (s *subjectPolicies) remove(txn statedb.ReadTxn, entries []*policy.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	after := drainAfter{ipcache: s.order.ipcache.Revision(txn), enforcement: s.order.enforcement.Revision(txn)}
	for _, e := range entries {
		sp, ok := s.subjects[e.Key.Subject]
		if !ok {
			continue
		}
		k := bpfmaps.NewPolicyKey(e.Key)
		delete(sp.wanted, k)
		delete(sp.unwritten, k)
		s.clearFailedDenyLocked(sp, k)
		if _, ok := sp.draining[k]; !ok {
			sp.draining[k] = after
		}
	}
	s.deleteDrainedLocked()
	s.releaseLocked()
}

// prune drains the keys of each subject's map that no row has, and
// releases the subjects that nothing uses (the previous run's included).
//
// Possible errors: a map cannot be read (joined).
func (s *subjectPolicies) prune(entries []*policy.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.readPinnedLocked(); err != nil {
		return err
	}
	bySubject := map[identity.Number][]*policy.Entry{}
	for _, e := range entries {
		bySubject[e.Key.Subject] = append(bySubject[e.Key.Subject], e)
	}
	var errs []error
	for id, sp := range s.subjects {
		stale, err := sp.ops.StaleKeys(func(yield func(*policy.Entry, statedb.Revision) bool) {
			for _, e := range bySubject[id] {
				if !yield(e, 0) {
					return
				}
			}
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, k := range stale {
			if _, ok := sp.draining[k]; !ok {
				// The oldest revisions: the tables as the prune sees them
				// are written by now or soon, and nothing wants the key.
				sp.draining[k] = drainAfter{}
			}
		}
	}
	s.deleteDrainedLocked()
	s.releaseLocked()
	return errors.Join(errs...)
}

// deleteDrainedLocked deletes the draining keys that may go: all of a
// subject no endpoint uses, else those whose drain conditions hold (as
// for the default's keys: the ipcache and enforcement writers are past
// the revisions, no held ipcache key maps to the key's identity). It
// returns how many are left and, if some wait for a revision, the oldest
// revisions they wait for.
func (s *subjectPolicies) deleteDrainedLocked() (left int, wait drainAfter, revisions bool) {
	ipcacheWritten := written(s.order.ipcacheWriter)
	switchedOff, _ := s.order.switchedOff.Get()
	for id, sp := range s.subjects {
		if len(sp.draining) == 0 {
			continue
		}
		unused := !sp.inOuter || s.order.uses.users(id) == 0
		if !unused && (s.hasEndpoints == nil || !s.hasEndpoints(id)) {
			// Its endpoints are leaving it: they still need its keys.
			left += len(sp.draining)
			continue
		}
		var ready []bpfmaps.PolicyKey
		for k, after := range sp.draining {
			if !unused {
				remote, _, _, _ := k.Fields()
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
				if held, _ := s.order.heldIdentity(remote); held {
					continue
				}
			}
			ready = append(ready, k)
		}
		for _, k := range ready {
			delete(sp.draining, k)
		}
		if err := sp.ops.DeleteKeys(ready); err != nil {
			s.log.Error("Cannot delete policy map entries of a subject; the next prune retries", "subject", id, "error", err)
		}
		left += len(sp.draining)
	}
	return left, wait, revisions
}

// drainRound deletes what may go now and releases the subjects nothing
// uses; the drain job calls it when the writers progress.
func (s *subjectPolicies) drainRound() (left int, wait drainAfter, revisions bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left, wait, revisions = s.deleteDrainedLocked()
	s.releaseLocked()
	return left, wait, revisions
}

// releaseLocked removes from the outer map, and closes, the inner maps of
// the subjects that have no row, no endpoint and no enforcement entry.
func (s *subjectPolicies) releaseLocked() {
	if !s.order.uses.known() {
		return // the endpoints map's users are not read yet
	}
	for id, sp := range s.subjects {
		if len(sp.wanted) > 0 || s.order.uses.users(id) > 0 || s.order.uses.enforced(id) {
			continue
		}
		if sp.inOuter {
			key := uint32(id)
			if err := s.outer().Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				s.log.Error("Cannot remove a subject's policy map from the outer policy map; retried at the next change", "subject", id, "error", err)
				continue
			}
		}
		if sp.inner.close != nil {
			if err := sp.inner.close(); err != nil {
				s.log.Warn("Cannot close a subject's policy map", "subject", id, "error", err)
			}
		}
		delete(s.subjects, id)
	}
}

// use makes sure the outer map holds the subject's inner map, which has
// every entry the policy writer was asked for (made empty if the subject
// has none: only its enforcement decides then). The endpoints writer
// calls it before it points an endpoint at the subject.
//
// Possible errors: ErrTooManySubjects, ErrPolicyEntriesNotWritten (some
// entry of the subject could not be written), the outer map's.
func (s *subjectPolicies) use(id identity.Number) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, err := s.getLocked(id)
	if err != nil {
		return err
	}
	if n := len(sp.unwritten); n > 0 {
		return fmt.Errorf("%w: %d policy entries of subject %d", ErrPolicyEntriesNotWritten, n, id)
	}
	if sp.inOuter {
		return nil
	}
	key := uint32(id)
	if err := s.outer().Put(&key, sp.inner.handle); err != nil {
		return fmt.Errorf("insert the policy map of subject %d into the outer %s map: %w", id, bpfmaps.PolicyName, err)
	}
	sp.inOuter = true
	return nil
}

// failClosed returns the directions of subjects whose endpoints use a map
// that lacks a deny the map had no room for: those directions drop
// everything until it is written, so that the deny never fails open. The
// channel is closed when that may have changed.
func (s *subjectPolicies) failClosed() (map[policy.EnforcementKey]bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failedChanged == nil {
		s.failedChanged = make(chan struct{})
	}
	closed := map[policy.EnforcementKey]bool{}
	for id, sp := range s.subjects {
		if !sp.inOuter {
			continue // no endpoint points at it: use refuses until written
		}
		for _, dir := range sp.failedDenies {
			closed[policy.EnforcementKey{Subject: id, Direction: dir}] = true
		}
	}
	return closed, s.failedChanged
}

func (s *subjectPolicies) clearFailedDenyLocked(sp *subjectPolicy, k bpfmaps.PolicyKey) {
	if _, ok := sp.failedDenies[k]; ok {
		delete(sp.failedDenies, k)
		s.failedChangedLocked()
	}
}

func (s *subjectPolicies) failedChangedLocked() {
	if s.failedChanged != nil {
		close(s.failedChanged)
		s.failedChanged = nil
	}
}

// withMap calls fn with the subject's map if the outer map holds it, else
// with nil; the map stays open meanwhile.
func (s *subjectPolicies) withMap(id identity.Number, fn func(mapwrite.Map) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp, ok := s.subjects[id]; ok && sp.inOuter {
		return fn(sp.inner.write)
	}
	return fn(nil)
}

// count returns the number of subjects with an inner map, and how many of
// those the outer map holds.
func (s *subjectPolicies) count() (maps, inOuter int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range s.subjects {
		maps++
		if sp.inOuter {
			inOuter++
		}
	}
	return maps, inOuter
}
