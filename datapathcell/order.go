// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// ordering keeps the three map writers in the order the invariant needs
// (make before break: datapathcell/README.md):
//
//   - the ipcache writer writes a table state only once the selectors have
//     computed the policy entries of that state and the policy writer has
//     written them (policy entries before the ipcache entries that point at
//     their identity); an entry whose identity has a policy entry that
//     could not be written is held: the map keeps its old value;
//   - the policy writer deletes a key only once the ipcache writer has
//     written the ipcache table as it was when the key's row went, and no
//     held ipcache key still maps to the key's identity (ipcache entries
//     stop pointing at an identity before its policy entries go);
//   - the enforcement writer switches a direction on only once both writers
//     have written the tables as they were when the row said so, and off at
//     once; the ipcache writer and the policy writer's deletes wait for the
//     switch off.
//
// No writer waits for one that waits for it: the policy writer's updates
// and the switch off wait for nothing, the ipcache writer waits only for
// those, and the policy deletes and the switch on wait without blocking
// their writer.
type ordering struct {
	log         *slog.Logger
	selectors   policy.Progress
	ipcache     statedb.Table[*ipcachecell.Entry]
	entries     statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]

	// Set at registration, before any writer runs.
	ipcacheWriter reconciler.Reconciler[*ipcachecell.Entry]
	policyWriter  reconciler.Reconciler[*policy.Entry]

	// switchedOff is the `policy-enforcement` revision up to which every
	// direction the table says is not enforced is off in the map.
	switchedOff *progress.Tracker[statedb.Revision]
	// uses is what points at each subject in the endpoints and
	// enforcement maps (endpointwriter.go).
	uses *subjectUses

	mu sync.Mutex
	// unwritten are, by identity, its policy keys whose write failed.
	unwritten map[identity.Number]map[bpfmaps.PolicyKey]struct{}
	// held are the ipcache keys whose write failed or was held, with the
	// identity the map still gives their addresses (0: none); heldBy
	// counts them by that identity.
	held   map[bpfmaps.IPCacheKey]identity.Number
	heldBy map[identity.Number]int
	// heldGone is closed and replaced when a held key is written.
	heldGone chan struct{}
	// numUnwritten and numHeld let the writers skip the lock when there
	// is nothing to look up, which is almost always.
	numUnwritten, numHeld atomic.Int64
}

func newOrdering(log *slog.Logger, selectors policy.Progress, ipcache statedb.Table[*ipcachecell.Entry],
	entries statedb.Table[*policy.Entry], enforcement statedb.Table[*policy.Enforcement]) *ordering {
	return &ordering{
		log: log, selectors: selectors, ipcache: ipcache, entries: entries, enforcement: enforcement,
		switchedOff: progress.New[statedb.Revision](0),
		uses:        newSubjectUses(),
		unwritten:   map[identity.Number]map[bpfmaps.PolicyKey]struct{}{},
		held:        map[bpfmaps.IPCacheKey]identity.Number{},
		heldBy:      map[identity.Number]int{},
		heldGone:    make(chan struct{}),
	}
}

// beforeIPCacheWrite waits until the ipcache map may be written as txn has
// the `ipcache` table: the selectors have computed the policy tables for
// txn's identities and policies, the policy writer has written (or tried)
// those entries, and every direction no longer enforced is off. Deletes
// wait for the policy entries too: a deleted prefix's addresses fall back
// to a covering prefix, whose identity's entries may be new.
func (o *ordering) beforeIPCacheWrite(ctx context.Context, txn statedb.ReadTxn) error {
	computed, err := o.selectors.WaitComputed(ctx, txn)
	if err != nil {
		return err
	}
	if _, _, err := o.policyWriter.WaitUntilReconciled(ctx, computed.Entries); err != nil {
		return err
	}
	_, err = o.switchedOff.Wait(ctx, func(rev statedb.Revision) bool { return rev >= computed.Enforcement })
	return err
}

// holdIPCache says why an ipcache value must not be written yet: some
// policy entry of its identity is not in the policy map.
func (o *ordering) holdIPCache(v bpfmaps.IPCacheValue) error {
	if o.numUnwritten.Load() == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.unwritten[v.Identity()]); n > 0 {
		return fmt.Errorf("%w: %d policy entries of identity %d", ErrPolicyEntriesNotWritten, n, v.Identity())
	}
	return nil
}

// ipcacheFailed records that the map keeps its value for k, and which
// identity that gives k's addresses (a lookup of an LPM trie finds the
// longest prefix that covers the key: k itself or what it falls back to).
func (o *ordering) ipcacheFailed(m mapwrite.Map, k bpfmaps.IPCacheKey) {
	var v bpfmaps.IPCacheValue
	id := identity.Number(0)
	if err := m.Lookup(&k, &v); err == nil {
		id = v.Identity()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, ok := o.held[k]; ok {
		o.unheldLocked(old)
	} else if o.numHeld.Add(1) == 1 {
		o.log.Warn("An ipcache map entry keeps its previous value: its write failed or waits for the policy map (datapath/ipcache-status says why)",
			"prefix", prefixOf(k), "identity-in-map", id)
	}
	o.held[k] = id
	o.heldBy[id]++
}

// ipcacheWritten records that k has its desired value (or is deleted).
func (o *ordering) ipcacheWritten(k bpfmaps.IPCacheKey) {
	if o.numHeld.Load() == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old, ok := o.held[k]
	if !ok {
		return
	}
	delete(o.held, k)
	if o.numHeld.Add(-1) == 0 {
		o.log.Info("Every ipcache map entry has its desired value again")
	}
	o.unheldLocked(old)
	close(o.heldGone)
	o.heldGone = make(chan struct{})
}

func (o *ordering) unheldLocked(id identity.Number) {
	if o.heldBy[id]--; o.heldBy[id] <= 0 {
		delete(o.heldBy, id)
	}
}

// prefixOf is k's prefix for a log line.
func prefixOf(k bpfmaps.IPCacheKey) string {
	p, err := k.Prefix()
	if err != nil {
		return fmt.Sprintf("%x", k)
	}
	return p.String()
}

// heldIdentity reports whether a held ipcache key still maps to id, and
// returns a channel closed when a held key is written.
func (o *ordering) heldIdentity(id identity.Number) (bool, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.heldBy[id] > 0, o.heldGone
}

// policyFailed records a policy key whose write failed.
func (o *ordering) policyFailed(k bpfmaps.PolicyKey) {
	id, _, _, _ := k.Fields()
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := o.unwritten[id]
	if keys == nil {
		keys = map[bpfmaps.PolicyKey]struct{}{}
		o.unwritten[id] = keys
	}
	if _, ok := keys[k]; !ok {
		keys[k] = struct{}{}
		o.numUnwritten.Add(1)
	}
}

// policyWritten records a policy key written or deleted.
func (o *ordering) policyWritten(k bpfmaps.PolicyKey) {
	if o.numUnwritten.Load() == 0 {
		return
	}
	id, _, _, _ := k.Fields()
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := o.unwritten[id]
	if _, ok := keys[k]; !ok {
		return
	}
	delete(keys, k)
	o.numUnwritten.Add(-1)
	if len(keys) == 0 {
		delete(o.unwritten, id)
	}
}

// progressOf is what a statedb reconciler tells of its progress.
type progressOf interface {
	WaitUntilReconciled(ctx context.Context, untilRevision statedb.Revision) (statedb.Revision, statedb.Revision, error)
}

// written returns how far a writer has written its table (tried at least
// once), without waiting: with a cancelled context WaitUntilReconciled
// returns at once.
func written(r progressOf) statedb.Revision {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rev, _, _ := r.WaitUntilReconciled(ctx, ^statedb.Revision(0))
	return rev
}
