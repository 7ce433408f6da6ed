// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// newTestAllocator returns an allocator of the first size local numbers.
func newTestAllocator(tb testing.TB, size uint32) (*Allocator, *statedb.DB, statedb.Table[*Identity]) {
	tb.Helper()
	db := statedb.New()
	require.NoError(tb, db.Start())
	tb.Cleanup(func() { db.Stop() })
	table, err := NewIdentitiesTable(db)
	require.NoError(tb, err)
	last := identity.MinLocal + identity.Number(size) - 1
	return newAllocator(db, table, hivetest.Logger(tb), identity.MinLocal, last, identity.MinCluster, identity.MaxCluster), db, table
}

func cidr(n int) labels.Labels {
	l, _ := labels.New(fmt.Sprintf("cidr:10.%d.%d.0/24", n/256, n%256))
	return l
}

// tableState returns labels -> (identity, references) from the table.
func tableState(db *statedb.DB, table statedb.Table[*Identity]) map[labels.Labels]*Identity {
	state := map[labels.Labels]*Identity{}
	for ident := range table.All(db.ReadTxn()) {
		state[ident.Labels] = ident
	}
	return state
}

func TestSameLabelsSameNumber(t *testing.T) {
	a, db, table := newTestAllocator(t, 100)
	first, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	again, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.True(t, first.IsLocal())

	other, err := a.allocate(cidr(2), 0)
	require.NoError(t, err)
	require.NotEqual(t, first, other)

	require.Equal(t, uint32(2), tableState(db, table)[cidr(1)].References())
}

func TestLastReleaseFrees(t *testing.T) {
	a, db, table := newTestAllocator(t, 100)
	id, _ := a.allocate(cidr(1), 0)
	_, _ = a.allocate(cidr(1), 0)

	freed, err := a.release(id)
	require.NoError(t, err)
	require.False(t, freed, "one reference is left")
	require.Equal(t, uint32(1), tableState(db, table)[cidr(1)].References())

	freed, err = a.release(id)
	require.NoError(t, err)
	require.True(t, freed)
	require.Empty(t, tableState(db, table))

	_, err = a.release(id)
	require.ErrorIs(t, err, ErrNotAllocated, "a reference nobody holds cannot be released")
}

func TestFreedNumberIsReusable(t *testing.T) {
	a, _, _ := newTestAllocator(t, 3)
	var ids []identity.Number
	for n := range 3 {
		id, err := a.allocate(cidr(n), 0)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	_, err := a.release(ids[1])
	require.NoError(t, err)

	id, err := a.allocate(cidr(99), 0)
	require.NoError(t, err)
	require.Equal(t, ids[1], id, "the only free number is the freed one")
}

func TestFreedNumberIsNotReusedAtOnce(t *testing.T) {
	a, _, _ := newTestAllocator(t, 100)
	first, _ := a.allocate(cidr(1), 0)
	_, _ = a.release(first)
	second, _ := a.allocate(cidr(2), 0)
	require.NotEqual(t, first, second, "a number just freed is handed out again only after the search wraps")
}

func TestRequestedFreeNumberIsHonoured(t *testing.T) {
	a, _, _ := newTestAllocator(t, 100)
	want := identity.MinLocal + 42
	id, err := a.allocate(cidr(1), want)
	require.NoError(t, err)
	require.Equal(t, want, id)
}

func TestRequestedTakenNumberFallsBack(t *testing.T) {
	a, _, _ := newTestAllocator(t, 100)
	taken, _ := a.allocate(cidr(1), 0)

	id, err := a.allocate(cidr(2), taken)
	require.NoError(t, err)
	require.NotEqual(t, taken, id)
	require.True(t, id.IsLocal())

	for _, outOfRange := range []identity.Number{identity.World, identity.MinLocal + 100, identity.MaxLocal + 1} {
		id, err := a.allocate(labels.ForPrefix(netipPrefix(t, outOfRange)), outOfRange)
		require.NoError(t, err)
		require.NotEqual(t, outOfRange, id, "a number outside the space is not handed out")
	}
}

func TestRequestIgnoredForLabelsThatHaveAnIdentity(t *testing.T) {
	a, _, _ := newTestAllocator(t, 100)
	id, _ := a.allocate(cidr(1), 0)
	again, err := a.allocate(cidr(1), identity.MinLocal+50)
	require.NoError(t, err)
	require.Equal(t, id, again, "labels determine the identity")
}

func TestWithheldNumbersGoOnlyToRequestsNamingThem(t *testing.T) {
	a, db, table := newTestAllocator(t, 3)
	withheld := identity.MinLocal
	require.NoError(t, a.Withhold(withheld))
	_, _, found := table.Get(db.ReadTxn(), IdentityIndex.Query(withheld))
	require.False(t, found, "a withheld number that is not allocated has no row")
	require.Equal(t, 1, a.NumWithheld())

	x, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	y, err := a.allocate(cidr(2), 0)
	require.NoError(t, err)
	require.NotContains(t, []identity.Number{x, y}, withheld)

	_, err = a.allocate(cidr(3), 0)
	require.ErrorIs(t, err, ErrExhausted, "the withheld number is not free for unrelated requests")

	got, err := a.allocate(cidr(4), withheld)
	require.NoError(t, err)
	require.Equal(t, withheld, got, "a request naming a withheld number gets it")

	row, _, _ := table.Get(db.ReadTxn(), IdentityIndex.Query(withheld))
	require.True(t, row.Withheld(), "allocated and still withheld")
	_, err = a.release(got)
	require.NoError(t, err)
	_, _, found = table.Get(db.ReadTxn(), IdentityIndex.Query(withheld))
	require.False(t, found, "freed: no row")
	require.Equal(t, 1, a.NumWithheld(), "freed, the number stays withheld")
	_, err = a.allocate(cidr(6), 0)
	require.ErrorIs(t, err, ErrExhausted, "freed and withheld: still not free for unrelated requests")
	_, err = a.release(withheld)
	require.ErrorIs(t, err, ErrNotAllocated, "a withheld number that is not allocated has no reference to release")

	require.NoError(t, a.Unwithhold(withheld))
	require.Zero(t, a.NumWithheld())
	got, err = a.allocate(cidr(5), 0)
	require.NoError(t, err)
	require.Equal(t, withheld, got, "after unwithholding, the number is free for anyone")
}

func TestExhaustionFailsOnlyThatRequest(t *testing.T) {
	a, db, table := newTestAllocator(t, 2)
	x, _ := a.allocate(cidr(1), 0)
	_, _ = a.allocate(cidr(2), 0)
	before := tableState(db, table)

	_, err := a.allocate(cidr(3), 0)
	require.ErrorIs(t, err, ErrExhausted)
	require.ErrorContains(t, err, "cidr:10.0.3.0/24", "the error names the labels")
	require.Equal(t, before, tableState(db, table), "a failed request changes nothing")

	again, err := a.allocate(cidr(1), 0)
	require.NoError(t, err, "labels that have an identity still get references")
	require.Equal(t, x, again)

	_, _ = a.release(x)
	_, _ = a.release(x)
	_, err = a.allocate(cidr(3), 0)
	require.NoError(t, err, "room appears when a number is freed")
}

func TestEmptyLabels(t *testing.T) {
	a, _, _ := newTestAllocator(t, 10)
	_, err := a.allocate(labels.Labels{}, 0)
	require.ErrorIs(t, err, ErrNoLabels)
}

func TestAbortedTransactionLeavesNothing(t *testing.T) {
	a, db, table := newTestAllocator(t, 10)
	kept, _ := a.allocate(cidr(1), 0)

	txn := a.WriteTxn()
	_, err := a.AllocateTxn(txn, cidr(2), 0)
	require.NoError(t, err)
	_, err = a.ReleaseTxn(txn, kept)
	require.NoError(t, err)
	txn.Abort()

	state := tableState(db, table)
	require.Len(t, state, 1)
	require.Equal(t, kept, state[cidr(1)].ID)
}

// TestConcurrentAllocateRelease runs allocations and releases of shared
// label sets from many goroutines; each holds references and releases them
// all, and at the end the counts must be exact.
func TestConcurrentAllocateRelease(t *testing.T) {
	a, db, table := newTestAllocator(t, 1000)
	const workers, rounds, labelSets = 8, 300, 20

	var (
		mu       sync.Mutex
		numberOf = map[labels.Labels]identity.Number{}
		wg       sync.WaitGroup
	)
	kept := make([]map[labels.Labels]int, workers)
	for w := range workers {
		kept[w] = map[labels.Labels]int{}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			held := map[labels.Labels][]identity.Number{}
			for range rounds {
				lbls := cidr(rng.IntN(labelSets))
				if refs := held[lbls]; len(refs) > 0 && rng.IntN(2) == 0 {
					_, err := a.release(refs[len(refs)-1])
					if !assert.NoError(t, err) {
						return
					}
					held[lbls] = refs[:len(refs)-1]
					continue
				}
				id, err := a.allocate(lbls, 0)
				if !assert.NoError(t, err) {
					return
				}
				held[lbls] = append(held[lbls], id)
				mu.Lock()
				if prev, ok := numberOf[lbls]; ok && len(held[lbls]) > 1 {
					assert.Equal(t, prev, id, "while referenced, labels keep their number")
				}
				numberOf[lbls] = id
				mu.Unlock()
			}
			for lbls, refs := range held {
				kept[w][lbls] = len(refs)
			}
		})
	}
	wg.Wait()

	want := map[labels.Labels]uint32{}
	for _, k := range kept {
		for lbls, n := range k {
			if n > 0 {
				want[lbls] += uint32(n)
			}
		}
	}
	got := map[labels.Labels]uint32{}
	seen := map[identity.Number]bool{}
	for lbls, ident := range tableState(db, table) {
		got[lbls] = ident.References()
		require.False(t, seen[ident.ID], "number %d given to two label sets", ident.ID)
		seen[ident.ID] = true
	}
	require.Equal(t, want, got)
}

// TestTableEqualsModel applies random operations and after every one checks
// that the table is exactly the reference model: the same label sets with the
// same reference counts, distinct numbers in range, a number kept for as
// long as its labels are referenced, and requests honoured when free.
func TestTableEqualsModel(t *testing.T) {
	const size = 16
	a, db, table := newTestAllocator(t, size)
	type modelEntry struct {
		id   identity.Number
		refs uint32
	}
	model := map[labels.Labels]modelEntry{}
	rng := rand.New(rand.NewPCG(7, 7))

	for step := range 5000 {
		lbls := cidr(rng.IntN(24))
		entry, exists := model[lbls]
		switch {
		case exists && rng.IntN(2) == 0:
			freed, err := a.release(entry.id)
			require.NoError(t, err)
			entry.refs--
			require.Equal(t, entry.refs == 0, freed, "step %d", step)
			if entry.refs == 0 {
				delete(model, lbls)
			} else {
				model[lbls] = entry
			}
		default:
			requested := identity.Unknown
			if rng.IntN(2) == 0 {
				requested = identity.MinLocal + identity.Number(rng.IntN(size))
			}
			requestedFree := true
			for _, e := range model {
				requestedFree = requestedFree && e.id != requested
			}
			id, err := a.allocate(lbls, requested)
			if !exists && len(model) == size {
				require.ErrorIs(t, err, ErrExhausted, "step %d", step)
				break
			}
			require.NoError(t, err, "step %d", step)
			if exists {
				require.Equal(t, entry.id, id, "step %d", step)
			} else if requested != identity.Unknown && requestedFree {
				require.Equal(t, requested, id, "step %d: a free requested number is honoured", step)
			}
			model[lbls] = modelEntry{id: id, refs: entry.refs + 1}
		}

		state := tableState(db, table)
		require.Len(t, state, len(model), "step %d", step)
		numbers := map[identity.Number]bool{}
		for lbls, want := range model {
			got := state[lbls]
			require.Equal(t, want.id, got.ID, "step %d %s", step, lbls)
			require.Equal(t, want.refs, got.References(), "step %d %s", step, lbls)
			require.True(t, got.ID >= identity.MinLocal && got.ID < identity.MinLocal+size)
			numbers[got.ID] = true
		}
		require.Len(t, numbers, len(model), "step %d: numbers are distinct", step)
	}
}

// A number can be withheld twice, in one call (two pinned prefixes with
// one number) or in two, allocated or not: it is counted once, and the
// allocated one's row is marked. Unwithheld, the mark goes, and with it
// the count; the free number gets no row.
func TestWithholdTwice(t *testing.T) {
	a, db, table := newTestAllocator(t, 10)
	free, allocated := identity.MinLocal, identity.MinLocal+1
	got, err := a.allocate(cidr(1), allocated)
	require.NoError(t, err)
	require.Equal(t, allocated, got)
	require.NoError(t, a.Withhold(free, allocated, free, allocated))
	require.NoError(t, a.Withhold(allocated, free))
	require.Equal(t, 2, a.NumWithheld())
	rows := statedb.Collect(table.All(db.ReadTxn()))
	require.Equal(t, []*Identity{NewIdentity(allocated, cidr(1), 1, true)}, rows)

	require.NoError(t, a.Unwithhold(allocated, free, allocated))
	require.Zero(t, a.NumWithheld())
	rows = statedb.Collect(table.All(db.ReadTxn()))
	require.Equal(t, []*Identity{NewIdentity(allocated, cidr(1), 1, false)}, rows)
}

// Withholding numbers before anything is allocated (a restart) writes no
// row; a number allocated afterwards by request gets its row marked, and
// a number withheld is skipped by unrelated allocations wherever the
// search for a free number starts.
func TestWithholdBeforeAllocation(t *testing.T) {
	a, db, table := newTestAllocator(t, 4)
	require.NoError(t, a.Withhold(identity.MinLocal+1, identity.MinLocal+2))
	require.Zero(t, table.NumObjects(db.ReadTxn()))
	x, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinLocal, x)
	y, err := a.allocate(cidr(2), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinLocal+3, y, "the withheld numbers between are skipped")
	z, err := a.allocate(cidr(3), identity.MinLocal+2)
	require.NoError(t, err)
	require.Equal(t, identity.MinLocal+2, z)
	row, _, _ := table.Get(db.ReadTxn(), IdentityIndex.Query(z))
	require.Equal(t, NewIdentity(z, cidr(3), 1, true), row)
	_, err = a.allocate(cidr(4), 0)
	require.ErrorIs(t, err, ErrExhausted, "the last free number is withheld")
}

// The count shares its word with the withheld flag: the reference that
// would carry into the flag is refused, and the row is left as it was.
func TestReferenceLimit(t *testing.T) {
	a, db, table := newTestAllocator(t, 10)
	id, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	require.NoError(t, a.Withhold(id))
	txn := a.WriteTxn()
	_, _, err = a.table.Insert(txn, NewIdentity(id, cidr(1), maxReferences, true))
	require.NoError(t, err)
	txn.Commit()

	_, err = a.allocate(cidr(1), 0)
	require.ErrorIs(t, err, ErrTooManyReferences)
	row, _, _ := table.Get(db.ReadTxn(), IdentityIndex.Query(id))
	require.Equal(t, NewIdentity(id, cidr(1), maxReferences, true), row)

	freed, err := a.release(id)
	require.NoError(t, err)
	require.False(t, freed)
	again, err := a.allocate(cidr(1), 0)
	require.NoError(t, err, "below the limit again")
	require.Equal(t, id, again)
	row, _, _ = table.Get(db.ReadTxn(), IdentityIndex.Query(id))
	require.Equal(t, uint32(maxReferences), row.References())
	require.True(t, row.Withheld())

	require.Panics(t, func() { NewIdentity(id, cidr(1), maxReferences+1, false) })
}

// While the local space is held, a label set without an identity gets
// only a withheld number it requests; everything else that needs a new
// local number fails with ErrLocalHeld and allocates nothing. Existing
// identities and label identities are not held. Released, allocation is
// as before.
func TestHoldLocal(t *testing.T) {
	a, db, table := newTestAllocator(t, 100)
	existing, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	withheld, free := identity.MinLocal+10, identity.MinLocal+11
	require.NoError(t, a.Withhold(withheld))

	require.False(t, a.LocalHeld())
	release := a.HoldLocal()
	require.True(t, a.LocalHeld())
	select {
	case <-a.LocalReleased():
		t.Fatal("LocalReleased closed while held")
	default:
	}
	_, err = a.allocate(cidr(2), 0)
	require.ErrorIs(t, err, ErrLocalHeld, "a new number")
	_, err = a.allocate(cidr(2), free)
	require.ErrorIs(t, err, ErrLocalHeld, "a requested number restore may yet withhold")
	require.Len(t, tableState(db, table), 1, "nothing allocated by a held request")

	id, err := a.allocate(cidr(3), withheld)
	require.NoError(t, err)
	require.Equal(t, withheld, id, "the withheld number goes to the request naming it")
	id, err = a.allocate(cidr(1), 0)
	require.NoError(t, err)
	require.Equal(t, existing, id, "an existing identity is referenced")
	app, err := labels.New("k8s:app=x")
	require.NoError(t, err)
	id, err = a.allocate(app, 0)
	require.NoError(t, err)
	require.False(t, id.IsLocal(), "label identities are not held")

	second := a.HoldLocal()
	release()
	release() // only the first call counts
	_, err = a.allocate(cidr(2), 0)
	require.ErrorIs(t, err, ErrLocalHeld, "still held by the second holder")
	second()
	<-a.LocalReleased()
	require.False(t, a.LocalHeld())
	id, err = a.allocate(cidr(2), free)
	require.NoError(t, err)
	require.Equal(t, free, id)
	id, err = a.allocate(cidr(4), 0)
	require.NoError(t, err)
	require.True(t, id.IsLocal())
}
