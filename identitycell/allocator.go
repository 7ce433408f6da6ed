// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// Allocator hands out local identities. It is safe for concurrent use.
//
// A number is allocated exactly when the `identities` table has a row for
// it (the row's References is the number of outstanding references). The
// withheld numbers are a bitmap beside the table, not rows: restore
// withholds a million numbers at a restart, and a row each was a million
// table writes in the start hook and as many replaced by the resolution
// that allocates them (docs/SCALE.md). The row of an allocated number
// says whether it is withheld too. The bitmap changes only under a write
// transaction of the table, as the rows do, so that an allocation sees
// either all of a Withhold or none of it.
//
// Methods ending in Txn work inside a caller's write transaction (which
// must lock the identities table, see [Allocator.WriteTxn]) so that a
// caller can change its own tables and the identities it references
// atomically, and batch many allocations into one commit. If that
// transaction is aborted, nothing of it happened.
type Allocator struct {
	db    *statedb.DB
	table statedb.RWTable[*Identity]
	log   *slog.Logger

	// first and last bound the numbers this allocator hands out.
	first, last identity.Number

	mu sync.Mutex
	// next is where the search for a free number starts. It moves forward
	// only, so a number just freed is not handed out again until the search
	// wraps around: a datapath entry still carrying the old number is then
	// unlikely to take on a new meaning. It is a hint, not state; an
	// aborted transaction may leave it anywhere.
	next identity.Number

	// withheld has a bit per number of first..last, set while the number
	// is withheld; nil until the first Withhold. numWithheld counts the
	// bits set. Both change under mu and a write transaction of the
	// table (see Allocator).
	withheld    []uint64
	numWithheld int
}

// newAllocator returns an allocator of the numbers first..last, which must
// lie in the local scope.
func newAllocator(db *statedb.DB, table statedb.RWTable[*Identity], log *slog.Logger, first, last identity.Number) *Allocator {
	return &Allocator{
		db:    db,
		table: table,
		log:   log,
		first: first,
		last:  last,
		next:  first,
	}
}

// WriteTxn returns a write transaction that locks the identities table and
// the given tables, for use with the Txn methods.
func (a *Allocator) WriteTxn(tables ...statedb.TableMeta) statedb.WriteTxn {
	return a.db.WriteTxn(append([]statedb.TableMeta{a.table}, tables...)...)
}

// allocate takes a reference to the identity of lbls, allocating one if the
// label set has none. If an identity is allocated, the requested number is
// used if it is in range and free (withheld numbers included); otherwise the
// next free, non-withheld number is. requested may be IdentityUnknown.
//
// Possible errors: ErrNoLabels, ErrExhausted.
func (a *Allocator) allocate(lbls labels.Labels, requested identity.Number) (identity.Number, error) {
	txn := a.WriteTxn()
	id, err := a.AllocateTxn(txn, lbls, requested)
	if err != nil {
		txn.Abort()
		return identity.Unknown, err
	}
	txn.Commit()
	return id, nil
}

// release drops one reference to id, freeing the number when it was the
// last. It reports whether the number was freed.
//
// Possible errors: ErrNotAllocated.
func (a *Allocator) release(id identity.Number) (freed bool, err error) {
	txn := a.WriteTxn()
	freed, err = a.ReleaseTxn(txn, id)
	if err != nil {
		txn.Abort()
		return false, err
	}
	txn.Commit()
	return freed, nil
}

// AllocateTxn takes a reference to the identity of lbls inside the
// caller's write transaction, allocating one if the label set has none. If
// an identity is allocated, the requested number is used if it is in range
// and free (withheld numbers included); otherwise the next free,
// non-withheld number is. requested may be IdentityUnknown.
//
// Possible errors: ErrNoLabels, ErrExhausted (wrapped),
// ErrTooManyReferences (wrapped).
func (a *Allocator) AllocateTxn(txn statedb.WriteTxn, lbls labels.Labels, requested identity.Number) (identity.Number, error) {
	if lbls.IsEmpty() {
		return identity.Unknown, ErrNoLabels
	}
	if existing, _, found := a.table.Get(txn, LabelsIndex.Query(lbls)); found {
		if existing.References() == maxReferences {
			return identity.Unknown, fmt.Errorf("reference identity %d: %w", existing.ID, ErrTooManyReferences)
		}
		updated := *existing
		updated.refs++
		if _, _, err := a.table.Insert(txn, &updated); err != nil {
			return identity.Unknown, fmt.Errorf("reference identity %d: %w", existing.ID, err)
		}
		if requested != identity.Unknown && requested != existing.ID {
			a.log.Debug("Labels already have an identity, requested number not used",
				"labels", lbls, "identity", existing.ID, "requested", requested)
		}
		return existing.ID, nil
	}

	id, withheld, err := a.pickNumber(txn, requested)
	if err != nil {
		return identity.Unknown, fmt.Errorf("allocate identity for %s: %w", lbls, err)
	}
	// A withheld number stays withheld while allocated: freed, it is again
	// only for a request that names it.
	if _, _, err := a.table.Insert(txn, NewIdentity(id, lbls, 1, withheld)); err != nil {
		return identity.Unknown, fmt.Errorf("insert identity %d: %w", id, err)
	}
	if requested != identity.Unknown && requested != id {
		a.log.Debug("Requested identity not available, allocated another",
			"labels", lbls, "identity", id, "requested", requested)
	}
	return id, nil
}

// ReleaseTxn drops one reference to id inside the caller's write
// transaction, freeing the number when it was the last. It reports whether
// the number was freed.
//
// Possible errors: ErrNotAllocated (wrapped).
func (a *Allocator) ReleaseTxn(txn statedb.WriteTxn, id identity.Number) (freed bool, err error) {
	existing, _, found := a.table.Get(txn, IdentityIndex.Query(id))
	if !found || !existing.Allocated() {
		return false, fmt.Errorf("release identity %d: %w", id, ErrNotAllocated)
	}
	if existing.References() > 1 {
		updated := *existing
		updated.refs--
		if _, _, err := a.table.Insert(txn, &updated); err != nil {
			return false, fmt.Errorf("release identity %d: %w", id, err)
		}
		return false, nil
	}
	// A withheld number stays withheld: its bit is not the row's.
	if _, _, err := a.table.Delete(txn, existing); err != nil {
		return false, fmt.Errorf("free identity %d: %w", id, err)
	}
	return true, nil
}

// Withhold reserves the numbers for requests that name them. Numbers
// outside the allocator's range are ignored, and so is a number withheld
// already. Withholding an allocated number has no effect on its current
// owner; its row is marked withheld.
//
// Possible errors: statedb's write errors (a bug); nothing is withheld.
func (a *Allocator) Withhold(ids ...identity.Number) error {
	txn := a.WriteTxn()
	defer txn.Abort()
	a.mu.Lock()
	defer a.mu.Unlock()
	// The rows first, so that an error leaves the bits as they were. Only
	// allocated numbers have rows to mark: none at a restart, where
	// restore withholds before anything is allocated.
	if a.table.NumObjects(txn) > 0 {
		for _, id := range ids {
			if !a.inRange(id) {
				continue
			}
			existing, _, found := a.table.Get(txn, IdentityIndex.Query(id))
			if !found || existing.Withheld() {
				continue
			}
			updated := *existing
			updated.setWithheld(true)
			if _, _, err := a.table.Insert(txn, &updated); err != nil {
				return fmt.Errorf("withhold identity %d: %w", id, err)
			}
		}
	}
	if a.withheld == nil && len(ids) > 0 {
		a.withheld = make([]uint64, (int(a.last-a.first)+64)/64)
	}
	a.setWithheld(ids, true)
	txn.Commit()
	return nil
}

// Unwithhold returns the numbers to general use, in one transaction: the
// rows of those allocated lose their mark. A caller with many paces them
// (each row rewritten is one more dead object for statedb's graveyard
// collector).
//
// Possible errors: statedb's write errors (a bug); nothing is returned to
// use.
func (a *Allocator) Unwithhold(ids ...identity.Number) error {
	txn := a.WriteTxn()
	defer txn.Abort()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if !a.inRange(id) || !a.isWithheld(id) {
			continue
		}
		if existing, _, found := a.table.Get(txn, IdentityIndex.Query(id)); found && existing.Withheld() {
			updated := *existing
			updated.setWithheld(false)
			if _, _, err := a.table.Insert(txn, &updated); err != nil {
				return fmt.Errorf("unwithhold identity %d: %w", id, err)
			}
		}
	}
	// Cleared only once nothing can fail: an error returns nothing to use.
	a.setWithheld(ids, false)
	txn.Commit()
	return nil
}

// NumWithheld returns how many numbers are withheld, allocated or not.
func (a *Allocator) NumWithheld() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.numWithheld
}

// isWithheld reports whether an in-range id is withheld. Called with mu
// held.
func (a *Allocator) isWithheld(id identity.Number) bool {
	if a.withheld == nil {
		return false
	}
	n := uint(id - a.first)
	return a.withheld[n/64]&(1<<(n%64)) != 0
}

// setWithheld sets or clears the bits of the in-range ids, keeping the
// count. Called with mu held.
func (a *Allocator) setWithheld(ids []identity.Number, withheld bool) {
	if a.withheld == nil {
		return
	}
	for _, id := range ids {
		if !a.inRange(id) || a.isWithheld(id) == withheld {
			continue
		}
		n := uint(id - a.first)
		a.withheld[n/64] ^= 1 << (n % 64)
		if withheld {
			a.numWithheld++
		} else {
			a.numWithheld--
		}
	}
}

func (a *Allocator) inRange(id identity.Number) bool {
	return id >= a.first && id <= a.last
}

// LabelsTxn returns the labels of an allocated identity.
func (a *Allocator) LabelsTxn(txn statedb.ReadTxn, id identity.Number) (labels.Labels, bool) {
	ident, _, found := a.table.Get(txn, IdentityIndex.Query(id))
	if !found || !ident.Allocated() {
		return labels.Labels{}, false
	}
	return ident.Labels, true
}

// pickNumber returns the requested number if it is in range and free
// (withheld or not), else the next number that is neither allocated nor
// withheld. It reports whether the number is withheld.
func (a *Allocator) pickNumber(txn statedb.WriteTxn, requested identity.Number) (identity.Number, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inRange(requested) {
		if _, _, found := a.table.Get(txn, IdentityIndex.Query(requested)); !found {
			return requested, a.isWithheld(requested), nil
		}
	}

	size := int(a.last-a.first) + 1
	if a.table.NumObjects(txn) >= size {
		return identity.Unknown, false, a.exhausted()
	}
	id := a.next
	for range size {
		if !a.inRange(id) {
			id = a.first
		}
		if !a.isWithheld(id) {
			if _, _, found := a.table.Get(txn, IdentityIndex.Query(id)); !found {
				a.next = id + 1
				return id, false, nil
			}
		}
		id++
	}
	return identity.Unknown, false, a.exhausted()
}

func (a *Allocator) exhausted() error {
	return fmt.Errorf("search numbers %d..%d, each allocated or withheld: %w", a.first, a.last, ErrExhausted)
}

// RegisterProducer registers a producer of identities: a client of the
// allocator whose allocations make up what the table holds once the agent
// has started (the ipcache's resolver is the agent's one). The
// `identities` table counts as initialized, and the checkpoint of the
// previous run is replaced, only once every registered producer has called
// its done function. done takes a write transaction that locks the
// identities table ([Allocator.WriteTxn]), so that a producer can mark the
// table initialized in the transaction that completes its own work.
// Register before the hive starts.
func (a *Allocator) RegisterProducer(name string) (done func(statedb.WriteTxn)) {
	txn := a.WriteTxn()
	done = a.table.RegisterInitializer(txn, name)
	txn.Commit()
	return done
}
