// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/labels"
)

// Allocator hands out local identities. It is safe for concurrent use.
//
// Its state is the `identities` table: a number is allocated exactly when the
// table has a row for it, and the row's References is the number of
// outstanding references. Methods ending in Txn work inside a caller's write
// transaction (which must lock the identities table, see [Allocator.WriteTxn])
// so that a caller can change its own tables and the identities it references
// atomically, and batch many allocations into one commit. If that
// transaction is aborted, nothing of it happened.
type Allocator struct {
	db    *statedb.DB
	table statedb.RWTable[*Identity]
	log   *slog.Logger

	// first and last bound the numbers this allocator hands out.
	first, last NumericIdentity

	mu sync.Mutex
	// withheld numbers are handed out only to a request that names them.
	withheld map[NumericIdentity]struct{}
	// next is where the search for a free number starts. It moves forward
	// only, so a number just freed is not handed out again until the search
	// wraps around: a datapath entry still carrying the old number is then
	// unlikely to take on a new meaning. It is a hint; an aborted
	// transaction may leave it anywhere.
	next NumericIdentity
}

// newAllocator returns an allocator of the numbers first..last, which must
// lie in the local scope.
func newAllocator(db *statedb.DB, table statedb.RWTable[*Identity], log *slog.Logger, first, last NumericIdentity) *Allocator {
	return &Allocator{
		db:       db,
		table:    table,
		log:      log,
		first:    first,
		last:     last,
		withheld: map[NumericIdentity]struct{}{},
		next:     first,
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
func (a *Allocator) allocate(lbls labels.Labels, requested NumericIdentity) (NumericIdentity, error) {
	txn := a.WriteTxn()
	id, err := a.AllocateTxn(txn, lbls, requested)
	if err != nil {
		txn.Abort()
		return IdentityUnknown, err
	}
	txn.Commit()
	return id, nil
}

// release drops one reference to id, freeing the number when it was the
// last. It reports whether the number was freed.
//
// Possible errors: ErrNotAllocated.
func (a *Allocator) release(id NumericIdentity) (freed bool, err error) {
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
// Possible errors: ErrNoLabels, ErrExhausted (wrapped).
func (a *Allocator) AllocateTxn(txn statedb.WriteTxn, lbls labels.Labels, requested NumericIdentity) (NumericIdentity, error) {
	if lbls.IsEmpty() {
		return IdentityUnknown, ErrNoLabels
	}
	if existing, _, found := a.table.Get(txn, LabelsIndex.Query(lbls)); found {
		updated := *existing
		updated.References++
		if _, _, err := a.table.Insert(txn, &updated); err != nil {
			return IdentityUnknown, fmt.Errorf("reference identity %d: %w", existing.ID, err)
		}
		if requested != IdentityUnknown && requested != existing.ID {
			a.log.Debug("Labels already have an identity, requested number not used",
				"labels", lbls, "identity", existing.ID, "requested", requested)
		}
		return existing.ID, nil
	}

	id, err := a.pickNumber(txn, requested)
	if err != nil {
		return IdentityUnknown, fmt.Errorf("allocate identity for %s: %w", lbls, err)
	}
	if _, _, err := a.table.Insert(txn, &Identity{ID: id, Labels: lbls, References: 1}); err != nil {
		return IdentityUnknown, fmt.Errorf("insert identity %d: %w", id, err)
	}
	if requested != IdentityUnknown && requested != id {
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
func (a *Allocator) ReleaseTxn(txn statedb.WriteTxn, id NumericIdentity) (freed bool, err error) {
	existing, _, found := a.table.Get(txn, IdentityIndex.Query(id))
	if !found {
		return false, fmt.Errorf("release identity %d: %w", id, ErrNotAllocated)
	}
	if existing.References <= 1 {
		if _, _, err := a.table.Delete(txn, existing); err != nil {
			return false, fmt.Errorf("free identity %d: %w", id, err)
		}
		return true, nil
	}
	updated := *existing
	updated.References--
	if _, _, err := a.table.Insert(txn, &updated); err != nil {
		return false, fmt.Errorf("release identity %d: %w", id, err)
	}
	return false, nil
}

// Withhold reserves the numbers for requests that name them. Numbers outside
// the local space are ignored. Withholding an allocated number has no effect
// on its current owner.
func (a *Allocator) Withhold(ids ...NumericIdentity) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if a.inRange(id) {
			a.withheld[id] = struct{}{}
		}
	}
}

// Unwithhold returns the numbers to general use.
func (a *Allocator) Unwithhold(ids ...NumericIdentity) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		delete(a.withheld, id)
	}
}

// NumWithheld returns how many numbers are withheld.
func (a *Allocator) NumWithheld() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.withheld)
}

func (a *Allocator) inRange(id NumericIdentity) bool {
	return id >= a.first && id <= a.last
}

// LabelsTxn returns the labels of an allocated identity.
func (a *Allocator) LabelsTxn(txn statedb.ReadTxn, id NumericIdentity) (labels.Labels, bool) {
	identity, _, found := a.table.Get(txn, IdentityIndex.Query(id))
	if !found {
		return labels.Labels{}, false
	}
	return identity.Labels, true
}

func (a *Allocator) isFree(txn statedb.ReadTxn, id NumericIdentity) bool {
	_, _, found := a.table.Get(txn, IdentityIndex.Query(id))
	return !found
}

// pickNumber returns the requested number if it is in range and free, else
// the next free number that is not withheld.
func (a *Allocator) pickNumber(txn statedb.WriteTxn, requested NumericIdentity) (NumericIdentity, error) {
	if a.inRange(requested) && a.isFree(txn, requested) {
		return requested, nil
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	size := int(a.last-a.first) + 1
	if a.table.NumObjects(txn) >= size {
		return IdentityUnknown, a.exhausted()
	}
	id := a.next
	for range size {
		if !a.inRange(id) {
			id = a.first
		}
		_, withheld := a.withheld[id]
		if !withheld && a.isFree(txn, id) {
			a.next = id + 1
			return id, nil
		}
		id++
	}
	return IdentityUnknown, a.exhausted()
}

func (a *Allocator) exhausted() error {
	return fmt.Errorf("search numbers %d..%d (%d withheld): %w",
		a.first, a.last, len(a.withheld), ErrExhausted)
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
