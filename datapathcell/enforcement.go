// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// enforcementOf is the value a row asks for: default deny when enforced,
// else deny only when the direction has deny entries, else nothing.
func enforcementOf(row *policy.Enforcement) bpfmaps.EnforcementValue {
	switch {
	case row.Enforced:
		return bpfmaps.EnforceDefaultDeny
	case row.HasDeny:
		return bpfmaps.EnforceDenyOnly
	}
	return bpfmaps.EnforceNone
}

// enforcementWriter writes the `policy-enforcement` table into the
// enforcement map (an array indexed by the row's subject and direction),
// and keeps the map's tagged slot (bpfmaps.TaggedSubject) on in a
// direction while any endpoint's entry there is. It is not a statedb
// reconciler because a direction's switch on waits, without blocking the
// switch off of the other, until the ipcache and policy writers have
// written the tables as they were when the row said so (see ordering).
type enforcementWriter struct {
	db     *statedb.DB
	table  statedb.RWTable[*policy.Enforcement]
	target func() mapwrite.Map
	order  *ordering
	stats  *mapwrite.Stats
	log    *slog.Logger
	// failClosed returns the directions in which a deny that the full
	// policy map could not take has nothing there to be written over
	// (policyOps.failClosed): a direction of deny rules only is then
	// enforced with default deny, so that the deny never fails open
	// (nil: never).
	failClosed func() ([2]bool, <-chan struct{})
	// subjectsFailClosed returns the endpoints' directions whose policy
	// map lacks a deny it had no room for (subjectPolicies.failClosed):
	// they drop everything until it is written (nil: never).
	subjectsFailClosed func() (map[policy.EnforcementKey]bool, <-chan struct{})
}

// enforcementRetry bounds the wait before a failed write is tried again.
const (
	enforcementRetryMin = 100 * time.Millisecond
	enforcementRetryMax = 10 * time.Second
)

// run writes the table into the map as it changes.
func (w *enforcementWriter) run(ctx context.Context, health cell.Health) error {
	// The map keeps the previous run's switches until the table says
	// otherwise (it has no rows before the policies are known). What
	// it holds is known of the default's directions, read here; another
	// subject's row is written whatever it says.
	inMap := map[policy.EnforcementKey]bpfmaps.EnforcementValue{}
	for _, dir := range policy.Directions() {
		var v bpfmaps.EnforcementValue
		key := bpfmaps.NewEnforcementKey(0, dir)
		if err := w.target().Lookup(&key, &v); err == nil {
			inMap[policy.EnforcementKey{Direction: dir}] = v
		}
	}
	subjectsRead := w.readSubjects(inMap)
	var tagged [2]bpfmaps.EnforcementValue
	for dir := range tagged {
		key := bpfmaps.NewEnforcementKey(bpfmaps.TaggedSubject, policy.Direction(dir))
		if err := w.target().Lookup(&key, &tagged[dir]); err != nil {
			tagged[dir] = bpfmaps.EnforceNone // written below as the endpoints' entries say
		}
	}
	backoff := enforcementRetryMin
	for {
		txn := w.db.ReadTxn()
		rows, watch := w.table.AllWatch(txn)
		usesChanged := w.order.uses.wait()
		var (
			waiting bool
			errs    []error
			done    []revisioned
		)
		var failClosed [2]bool
		var guardChanged <-chan struct{}
		if w.failClosed != nil {
			failClosed, guardChanged = w.failClosed()
		}
		var subjectsClosed map[policy.EnforcementKey]bool
		var subjectsChanged <-chan struct{}
		if w.subjectsFailClosed != nil {
			subjectsClosed, subjectsChanged = w.subjectsFailClosed()
		}
		for row, rev := range rows {
			dir := row.Direction
			want := enforcementOf(row)
			// The guard watches the default's policy map only.
			closing := row.Subject == 0 && want == bpfmaps.EnforceDenyOnly && int(dir) < len(failClosed) && failClosed[dir]
			if closing {
				want = bpfmaps.EnforceDefaultDeny
			}
			if row.Subject != identity.Unknown && want != bpfmaps.EnforceNone && subjectsClosed[row.Key()] {
				closing, want = true, bpfmaps.EnforceDropAll
			}
			have, known := inMap[row.Key()]
			if !known && row.Subject != identity.Unknown && subjectsRead {
				// Read at start: a subject not there is 0 in the array.
				known = true
			}
			var err error
			switch {
			case known && want == have:
			case want == bpfmaps.EnforceNone:
				err = w.put(row.Key(), want)
			case closing && row.Subject != identity.Unknown:
				// Dropping more needs nothing written first.
				w.log.Warn("A deny rule is not in the endpoints' full policy map: "+
					"dropping all of their traffic in its direction until it is written (raise --policy-map-max-entries)",
					"direction", dir.String(), "subject", row.Subject)
				if err = w.putTagged(&tagged, dir, true); err == nil {
					err = w.put(row.Key(), want)
				}
			case closing:
				// Dropping more needs nothing written first.
				w.log.Warn("A deny rule is not in the full policy map and nothing there covers it: "+
					"enforcing default deny in its direction until it is written (raise --policy-map-max-entries)",
					"direction", dir.String())
				err = w.put(row.Key(), want)
			case w.onReady(txn):
				// Switching on, or between default deny and deny only:
				// either needs the entries in the maps first. An
				// endpoint's direction needs tagged frames dropped
				// first: they could be its traffic.
				if row.Subject != identity.Unknown {
					err = w.putTagged(&tagged, dir, true)
				}
				if err == nil {
					err = w.put(row.Key(), want)
				}
			default:
				waiting = true
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			inMap[row.Key()] = want
			if row.Status.Kind != reconciler.StatusKindDone {
				done = append(done, revisioned{row, rev})
			}
		}
		if w.deleteUnused(txn, inMap, &errs) {
			waiting = true
		}
		// Once the last endpoint's direction is off (or if a previous
		// run left one on without its tagged slot).
		for _, dir := range policy.Directions() {
			if err := w.putTagged(&tagged, dir, endpointEnforced(inMap, dir)); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			w.order.switchedOff.Set(w.table.Revision(txn))
			backoff = enforcementRetryMin
		}
		w.markDone(done)
		w.report(health, inMap, waiting, errs)

		var retry <-chan time.Time
		if len(errs) > 0 {
			retry = time.After(backoff)
			backoff = min(2*backoff, enforcementRetryMax)
		}
		ready := make(chan struct{})
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(ready)
			if waiting {
				w.waitOnReady(wctx, txn)
			} else {
				<-wctx.Done()
			}
		}()
		select {
		case <-ctx.Done():
		case <-watch:
		case <-retry:
		case <-ready:
		case <-guardChanged:
		case <-subjectsChanged:
		case <-usesChanged:
		}
		cancel()
		<-ready
		if ctx.Err() != nil {
			return nil
		}
	}
}

// onReady reports whether the ipcache and policy writers have written the
// tables as txn has them: then the entries of every policy in force, which
// txn has (a policy is in force only once its prefixes are resolved), are
// in both maps.
func (w *enforcementWriter) onReady(txn statedb.ReadTxn) bool {
	return written(w.order.policyWriter) >= w.order.entries.Revision(txn) &&
		written(w.order.ipcacheWriter) >= w.order.ipcache.Revision(txn)
}

func (w *enforcementWriter) waitOnReady(ctx context.Context, txn statedb.ReadTxn) {
	if _, _, err := w.order.policyWriter.WaitUntilReconciled(ctx, w.order.entries.Revision(txn)); err != nil {
		return
	}
	w.order.ipcacheWriter.WaitUntilReconciled(ctx, w.order.ipcache.Revision(txn))
}

func (w *enforcementWriter) put(k policy.EnforcementKey, value bpfmaps.EnforcementValue) error {
	key := bpfmaps.NewEnforcementKey(k.Subject, k.Direction)
	if err := w.target().Put(&key, &value); err != nil {
		return fmt.Errorf("switch %s enforcement of subject %d in the %s map: %w", k.Direction, k.Subject, bpfmaps.EnforcementName, err)
	}
	w.order.uses.setEnforcement(key, value)
	w.stats.Written.Add(1)
	attrs := []any{"direction", k.Direction.String()}
	if k.Subject != 0 {
		attrs = append(attrs, "subject", k.Subject)
	}
	switch value {
	case bpfmaps.EnforceDropAll:
		w.log.Info("Dropping everything", attrs...)
	case bpfmaps.EnforceDefaultDeny:
		w.log.Info("Enforcing policy", attrs...)
	case bpfmaps.EnforceDenyOnly:
		w.log.Info("Enforcing deny rules only", attrs...)
	default:
		w.log.Info("Not enforcing policy", attrs...)
	}
	return nil
}

// putTagged switches the tagged slot of dir on or off unless tagged says
// it is already.
func (w *enforcementWriter) putTagged(tagged *[2]bpfmaps.EnforcementValue, dir policy.Direction, on bool) error {
	value := bpfmaps.EnforceNone
	if on {
		value = bpfmaps.EnforceDefaultDeny
	}
	if tagged[dir] == value {
		return nil
	}
	key := bpfmaps.NewEnforcementKey(bpfmaps.TaggedSubject, dir)
	if err := w.target().Put(&key, &value); err != nil {
		return fmt.Errorf("switch %s dropping of VLAN-tagged frames in the %s map: %w", dir, bpfmaps.EnforcementName, err)
	}
	tagged[dir] = value
	w.stats.Written.Add(1)
	if on {
		w.log.Info("Dropping VLAN-tagged frames: an endpoint's direction is enforced", "direction", dir.String())
	} else {
		w.log.Info("Not dropping VLAN-tagged frames: no endpoint's direction is enforced", "direction", dir.String())
	}
	return nil
}

// endpointEnforced reports whether inMap has an endpoint's direction dir
// enforced.
func endpointEnforced(inMap map[policy.EnforcementKey]bpfmaps.EnforcementValue, dir policy.Direction) bool {
	for k, v := range inMap {
		if k.Subject != identity.Unknown && k.Direction == dir && v != bpfmaps.EnforceNone {
			return true
		}
	}
	return false
}

// revisioned is a row and its revision.
type revisioned struct {
	row *policy.Enforcement
	rev statedb.Revision
}

// markDone sets the status of rows that are in the map, unless they
// changed meanwhile (then the next round sees them).
func (w *enforcementWriter) markDone(rows []revisioned) {
	if len(rows) == 0 {
		return
	}
	txn := w.db.WriteTxn(w.table)
	defer txn.Commit()
	for _, r := range rows {
		_, _, err := w.table.CompareAndSwap(txn, r.rev, r.row.Clone().SetStatus(reconciler.StatusDone()))
		if err != nil && !errors.Is(err, statedb.ErrRevisionNotEqual) && !errors.Is(err, statedb.ErrObjectNotFound) {
			row := r.row
			w.log.Error("BUG: cannot write the enforcement status", "direction", row.Direction.String(), "error", err)
		}
	}
}

func (w *enforcementWriter) report(health cell.Health, inMap map[policy.EnforcementKey]bpfmaps.EnforcementValue, waiting bool, errs []error) {
	if len(errs) > 0 {
		health.Degraded("Enforcement map not written", errors.Join(errs...))
		return
	}
	var on []string
	for _, dir := range policy.Directions() {
		switch inMap[policy.EnforcementKey{Direction: dir}] {
		case bpfmaps.EnforceDefaultDeny:
			on = append(on, dir.String())
		case bpfmaps.EnforceDenyOnly:
			on = append(on, dir.String()+" (deny rules only)")
		}
	}
	if len(on) == 0 {
		on = []string{"none"}
	}
	msg := "Enforced: " + strings.Join(on, ", ")
	if waiting {
		msg += " (switching on once the policy entries are written)"
	}
	health.OK(msg)
}

// readSubjects adds to inMap the entries of the subjects other than 0
// that the map holds (a previous run's), so that a restart writes none
// that did not change, and tells the subjects' users.
func (w *enforcementWriter) readSubjects(inMap map[policy.EnforcementKey]bpfmaps.EnforcementValue) (read bool) {
	err := bpfmaps.ReadEntries(w.target(), func(k bpfmaps.EnforcementKey, v bpfmaps.EnforcementValue) {
		if k.Subject() == identity.Unknown || k.Subject() == bpfmaps.TaggedSubject || v == bpfmaps.EnforceNone {
			return
		}
		inMap[policy.EnforcementKey{Subject: k.Subject(), Direction: k.Direction()}] = v
		w.order.uses.setEnforcement(k, v)
	})
	if err != nil {
		// They are written again, as at a first start.
		w.log.Warn("Cannot read the subjects' entries of the enforcement map; writing them again", "error", err)
		return false
	}
	return true
}

// deleteUnused clears (to 0) the entries of subjects other than 0 that no
// row has, once the table is initialized and no endpoints map entry points at
// their subject: until then the endpoint's traffic still needs them (an
// entry deleted is a direction not enforced). It reports whether some
// wait for that.
func (w *enforcementWriter) deleteUnused(txn statedb.ReadTxn, inMap map[policy.EnforcementKey]bpfmaps.EnforcementValue, errs *[]error) (waiting bool) {
	if init, _ := w.table.Initialized(txn); !init {
		return false
	}
	for k := range inMap {
		if k.Subject == identity.Unknown {
			continue
		}
		if _, _, found := w.table.Get(txn, policy.EnforcementIndex.Query(k)); found {
			continue
		}
		if w.order.uses.users(k.Subject) > 0 {
			waiting = true
			continue
		}
		// An array: the entry goes back to 0, not enforced.
		key, off := bpfmaps.NewEnforcementKey(k.Subject, k.Direction), bpfmaps.EnforceNone
		if err := w.target().Put(&key, &off); err != nil {
			*errs = append(*errs, fmt.Errorf("clear %s enforcement of subject %d in the %s map: %w", k.Direction, k.Subject, bpfmaps.EnforcementName, err))
			continue
		}
		w.stats.Written.Add(1)
		delete(inMap, k)
		w.order.uses.setEnforcement(key, off)
	}
	return waiting
}
