// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"sync"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// Allocator hands out identities from two spaces: local (CIDR) identities
// in the local scope, and label identities (of endpoints, by their labels)
// in the cluster range, by the label set (see [IsLabelIdentity]). It is
// safe for concurrent use.
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
// transaction is aborted, nothing of it happened (but for the explicit
// identities' counts, see [Allocator.UseExplicitTxn]).
type Allocator struct {
	db    *statedb.DB
	table statedb.RWTable[*Identity]
	log   *slog.Logger

	mu sync.Mutex
	// local and cluster are the two spaces; each changes under mu.
	local, cluster space

	// previous is, for each label identity withheld for the label set that
	// had it (WithholdForLabels), that set, and previousNumber the reverse:
	// an allocation of the set without a requested number gets its number
	// back, and no other set gets it. Under mu, and a write transaction of
	// the table as the bitmap; an entry goes when its number is
	// un-withheld.
	previous       map[identity.Number]labels.Labels
	previousNumber map[labels.Labels]identity.Number

	// localHolds counts the holders of the local space (HoldLocal);
	// localReleased is closed while it is 0. Under mu.
	localHolds    int
	localReleased chan struct{}

	// explicit counts, per number of the cluster range, the users of the
	// number as an explicit identity (ipcache entries): it is never
	// allocated to a label set while counted. Under mu.
	explicit map[identity.Number]uint32
}

// space is one range of numbers the allocator hands out.
type space struct {
	// name says which in errors ("local", "label").
	name string
	// first and last bound the numbers this space hands out.
	first, last identity.Number

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

func newSpace(name string, first, last identity.Number) space {
	return space{name: name, first: first, last: last, next: first}
}

// newAllocator returns an allocator of the local numbers first..last,
// which must lie in the local scope, and of the label identities in
// clusterFirst..clusterLast, which must lie in the cluster range.
func newAllocator(db *statedb.DB, table statedb.RWTable[*Identity], log *slog.Logger,
	first, last, clusterFirst, clusterLast identity.Number) *Allocator {
	released := make(chan struct{})
	close(released)
	return &Allocator{
		db:            db,
		table:         table,
		log:           log,
		local:         newSpace("local", first, last),
		cluster:       newSpace("label", clusterFirst, clusterLast),
		localReleased: released,
	}
}

// IsLabelIdentity reports whether lbls is the label set of a label
// identity: one with no cidr label and a label of a source other than
// reserved (an endpoint's k8s: labels). A set with a cidr label is a
// local (CIDR) identity's, whatever else it holds: the ipcache adds the
// prefix's cidr label to the labels its owners give a prefix, and those
// identities are local, as they always were.
func IsLabelIdentity(lbls labels.Labels) bool {
	if _, ok := lbls.OnlyPrefix(); ok {
		return false
	}
	s := lbls.String()
	// The canonical form is sorted: a CIDR identity's one label is told
	// by its start, without splitting the set.
	if strings.HasPrefix(s, labels.SourceCIDR+":") || strings.Contains(s, ","+labels.SourceCIDR+":") {
		return false
	}
	for label := range lbls.All() {
		if !strings.HasPrefix(label, labels.SourceReserved+":") {
			return true
		}
	}
	return false
}

// spaceFor returns the space of the identity of lbls.
func (a *Allocator) spaceFor(lbls labels.Labels) *space {
	if IsLabelIdentity(lbls) {
		return &a.cluster
	}
	return &a.local
}

// spaceOf returns the space id lies in, or nil.
func (a *Allocator) spaceOf(id identity.Number) *space {
	switch {
	case a.local.inRange(id):
		return &a.local
	case a.cluster.inRange(id):
		return &a.cluster
	}
	return nil
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
// A label set's identity (see [IsLabelIdentity]) is a label identity, in
// the cluster range; any other set's is local. A label set that had a
// number withheld for it ([Allocator.WithholdForLabels]) gets that number
// when it requests none, and a number so withheld goes to no other set.
// Numbers in use as explicit identities ([Allocator.UseExplicitTxn]) go to
// no label set.
//
// While the local space is held ([Allocator.HoldLocal]), a set that needs
// a new local identity gets one only if it requests a withheld number
// that is free.
//
// Possible errors: ErrNoLabels, ErrExhausted (wrapped, naming the space),
// ErrTooManyReferences (wrapped), ErrLocalHeld.
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

	id, withheld, err := a.pickNumber(txn, a.spaceFor(lbls), lbls, requested)
	if err == ErrLocalHeld {
		// As is: the caller asks again, and a restart may see it for
		// each of a million prefixes.
		return identity.Unknown, err
	}
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
// outside the allocator's spaces are ignored, and so is a number withheld
// already. Withholding an allocated number has no effect on its current
// owner; its row is marked withheld.
//
// Possible errors: statedb's write errors (a bug); nothing is withheld.
func (a *Allocator) Withhold(ids ...identity.Number) error {
	txn := a.WriteTxn()
	defer txn.Abort()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.withholdLocked(txn, ids); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// withholdLocked withholds ids: marks their rows, then sets their bits.
// Called with mu held, in txn.
func (a *Allocator) withholdLocked(txn statedb.WriteTxn, ids []identity.Number) error {
	// The rows first, so that an error leaves the bits as they were. Only
	// allocated numbers have rows to mark: none at a restart, where
	// restore withholds before anything is allocated.
	if a.table.NumObjects(txn) > 0 {
		for _, id := range ids {
			if a.spaceOf(id) == nil {
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
	for _, id := range ids {
		if s := a.spaceOf(id); s != nil {
			s.setWithheld(id, true)
		}
	}
	return nil
}

// WithholdForLabels withholds each label identity of previous (number ->
// labels, as a checkpoint lists them) for its label set: until the number
// is un-withheld, an allocation of that set without a requested number
// gets it back, and no other set gets it. Entries that are not label
// identities (a local number, labels of a local identity) are ignored. It
// returns the numbers withheld, for the caller to un-withhold.
//
// Possible errors: statedb's write errors (a bug); nothing is withheld.
func (a *Allocator) WithholdForLabels(previous iter.Seq2[identity.Number, labels.Labels]) ([]identity.Number, error) {
	var (
		ids  []identity.Number
		sets []labels.Labels
	)
	for id, lbls := range previous {
		if a.cluster.inRange(id) && IsLabelIdentity(lbls) {
			ids, sets = append(ids, id), append(sets, lbls)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	txn := a.WriteTxn()
	defer txn.Abort()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.withholdLocked(txn, ids); err != nil {
		return nil, err
	}
	if a.previous == nil {
		a.previous, a.previousNumber = map[identity.Number]labels.Labels{}, map[labels.Labels]identity.Number{}
	}
	for i, id := range ids {
		if old, had := a.previous[id]; had {
			delete(a.previousNumber, old)
		}
		a.previous[id], a.previousNumber[sets[i]] = sets[i], id
	}
	txn.Commit()
	return ids, nil
}

// Unwithhold returns the numbers to general use, in one transaction: the
// rows of those allocated lose their mark, and a label identity is no
// longer kept for the set that had it. A caller with many paces them
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
		if s := a.spaceOf(id); s == nil || !s.isWithheld(id) {
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
	for _, id := range ids {
		if s := a.spaceOf(id); s != nil {
			s.setWithheld(id, false)
		}
		if lbls, had := a.previous[id]; had {
			delete(a.previous, id)
			delete(a.previousNumber, lbls)
		}
	}
	txn.Commit()
	return nil
}

// NumWithheld returns how many numbers are withheld, allocated or not.
func (a *Allocator) NumWithheld() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.local.numWithheld + a.cluster.numWithheld
}

// WithheldNumber reports whether id is withheld, and the labels it is kept
// for when it is a label identity withheld for its previous set.
func (a *Allocator) WithheldNumber(id identity.Number) (withheld bool, previous labels.Labels) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.spaceOf(id)
	if s == nil || !s.isWithheld(id) {
		return false, labels.Labels{}
	}
	return true, a.previous[id]
}

// UseExplicitTxn records, inside the caller's write transaction, one more
// user of id as an explicit identity (an identity allocated elsewhere,
// which an ipcache entry maps to): while it has one, the number is
// allocated to no label set. Numbers outside the cluster range are
// ignored: only label sets could take them. A number allocated already
// keeps its identity: the endpoints map their addresses to the label
// identities they hold as explicit identities. The count is the
// allocator's, not the table's: the caller's transaction must be
// committed, as the ipcache's resolver always does.
func (a *Allocator) UseExplicitTxn(txn statedb.WriteTxn, id identity.Number) {
	if !a.cluster.inRange(id) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.explicit == nil {
		a.explicit = map[identity.Number]uint32{}
	}
	a.explicit[id]++
}

// ReleaseExplicitTxn drops one user of id as an explicit identity
// recorded by [Allocator.UseExplicitTxn]; with none left, label sets may
// get the number again.
func (a *Allocator) ReleaseExplicitTxn(txn statedb.WriteTxn, id identity.Number) {
	if !a.cluster.inRange(id) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch n := a.explicit[id]; n {
	case 0:
		a.log.Error("BUG: explicit identity released more often than used", "identity", id)
	case 1:
		delete(a.explicit, id)
	default:
		a.explicit[id] = n - 1
	}
}

// isWithheld reports whether an in-range id is withheld. Called with mu
// held.
func (s *space) isWithheld(id identity.Number) bool {
	if s.withheld == nil {
		return false
	}
	n := uint(id - s.first)
	return s.withheld[n/64]&(1<<(n%64)) != 0
}

// setWithheld sets or clears the bit of an in-range id, keeping the
// count. Called with mu held.
func (s *space) setWithheld(id identity.Number, withheld bool) {
	if s.isWithheld(id) == withheld {
		return
	}
	if s.withheld == nil {
		s.withheld = make([]uint64, (int(s.last-s.first)+64)/64)
	}
	n := uint(id - s.first)
	s.withheld[n/64] ^= 1 << (n % 64)
	if withheld {
		s.numWithheld++
	} else {
		s.numWithheld--
	}
}

func (s *space) inRange(id identity.Number) bool {
	return id >= s.first && id <= s.last
}

// LabelsTxn returns the labels of an allocated identity.
func (a *Allocator) LabelsTxn(txn statedb.ReadTxn, id identity.Number) (labels.Labels, bool) {
	ident, _, found := a.table.Get(txn, IdentityIndex.Query(id))
	if !found || !ident.Allocated() {
		return labels.Labels{}, false
	}
	return ident.Labels, true
}

// pickNumber returns the requested number if it is in s and free
// (withheld or not), else the next number of s that is neither allocated
// nor withheld. It reports whether the number is withheld. For a label
// identity, the number withheld for lbls is the one requested when none
// is, and numbers withheld for another set or in use as explicit
// identities are not free.
func (a *Allocator) pickNumber(txn statedb.WriteTxn, s *space, lbls labels.Labels, requested identity.Number) (identity.Number, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	isCluster := s == &a.cluster
	if isCluster && requested == identity.Unknown {
		if previous, found := a.previousNumber[lbls]; found {
			requested = previous
		}
	}
	if s.inRange(requested) && (!isCluster || a.mayTake(requested, lbls)) {
		if _, _, found := a.table.Get(txn, IdentityIndex.Query(requested)); !found {
			withheld := s.isWithheld(requested)
			if withheld || isCluster || a.localHolds == 0 {
				return requested, withheld, nil
			}
		}
	}
	if !isCluster && a.localHolds > 0 {
		return identity.Unknown, false, ErrLocalHeld
	}

	size := int(s.last-s.first) + 1
	if !isCluster {
		// Every row counts but the label identities': those are few, and
		// counted only when the local space may be full.
		if n := a.table.NumObjects(txn); n >= size && n-a.countRows(txn, &a.cluster) >= size {
			return identity.Unknown, false, s.exhausted()
		}
	}
	id := s.next
	for range size {
		if !s.inRange(id) {
			id = s.first
		}
		if !s.isWithheld(id) && (!isCluster || a.explicit[id] == 0) {
			if _, _, found := a.table.Get(txn, IdentityIndex.Query(id)); !found {
				s.next = id + 1
				return id, false, nil
			}
		}
		id++
	}
	return identity.Unknown, false, s.exhausted()
}

// HoldLocal holds the local space until the returned release is called:
// meanwhile a label set that needs a new local identity gets only a
// withheld number it requests (ErrLocalHeld otherwise). Restore holds it
// while it withholds the previous run's numbers as it reads the pinned
// map: a number handed out before restore has seen it would renumber the
// prefix that had it. Label identities are not held:
// theirs are withheld at once, from the checkpoint.
//
// Release may be called more than once; only its first call counts.
func (a *Allocator) HoldLocal() (release func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.localHolds == 0 {
		a.localReleased = make(chan struct{})
	}
	a.localHolds++
	var once sync.Once
	return func() {
		once.Do(func() {
			// Under a write transaction of the table, as an allocation
			// is: a caller that sees the space held in its transaction
			// sees it held until it commits.
			txn := a.WriteTxn()
			defer txn.Abort()
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.localHolds--; a.localHolds == 0 {
				close(a.localReleased)
			}
		})
	}
}

// LocalHeld reports whether someone holds the local space
// ([Allocator.HoldLocal]). Inside a write transaction of the table
// ([Allocator.WriteTxn]), the answer holds until the transaction ends.
func (a *Allocator) LocalHeld() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.localHolds > 0
}

// LocalReleased returns a channel that is closed once no one holds the
// local space ([Allocator.HoldLocal]); it is closed already if no one
// does.
func (a *Allocator) LocalReleased() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.localReleased
}

// mayTake reports whether the label set may take the cluster number id:
// it is no explicit identity, and not withheld for another set. Called
// with mu held.
func (a *Allocator) mayTake(id identity.Number, lbls labels.Labels) bool {
	if a.explicit[id] > 0 {
		return false
	}
	previous, kept := a.previous[id]
	return !kept || previous == lbls
}

// countRows counts the rows of numbers in s.
func (a *Allocator) countRows(txn statedb.ReadTxn, s *space) int {
	n := 0
	for ident := range a.table.LowerBound(txn, IdentityIndex.Query(s.first)) {
		if ident.ID > s.last {
			break
		}
		n++
	}
	return n
}

func (s *space) exhausted() error {
	return fmt.Errorf("search numbers %d..%d, each allocated or withheld: %w", s.first, s.last, exhaustedError{s.name})
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
