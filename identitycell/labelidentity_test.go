// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"maps"
	"testing"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// newSizedAllocator returns an allocator of the first localSize local
// numbers and the first clusterSize label identities.
func newSizedAllocator(tb testing.TB, localSize, clusterSize uint32) *Allocator {
	tb.Helper()
	db := statedb.New()
	require.NoError(tb, db.Start())
	tb.Cleanup(func() { db.Stop() })
	table, err := NewIdentitiesTable(db)
	require.NoError(tb, err)
	return newAllocator(db, table, hivetest.Logger(tb),
		identity.MinLocal, identity.MinLocal+identity.Number(localSize)-1,
		identity.MinCluster, identity.MinCluster+identity.Number(clusterSize)-1)
}

func mustLabels(tb testing.TB, s string) labels.Labels {
	tb.Helper()
	l, err := labels.Parse(s)
	require.NoError(tb, err)
	return l
}

func TestIsLabelIdentity(t *testing.T) {
	for s, want := range map[string]bool{
		"k8s:app=web":                      true,
		"k8s:app=web,k8s:tier=front":       true,
		"k8s:app=web,reserved:host":        true,
		"app:x":                            true,
		"cidr:10.0.0.0/8":                  false,
		"app:x,cidr:10.0.0.0/8":            false, // the ipcache's: an owner's labels and the prefix's
		"cidr:10.0.0.0/8,k8s:app=web":      false,
		"reserved:world":                   false,
		"cidr:192.0.2.0/24,reserved:world": false,
	} {
		require.Equal(t, want, IsLabelIdentity(mustLabels(t, s)), s)
	}
}

func TestLabelIdentitiesInClusterRange(t *testing.T) {
	a := newSizedAllocator(t, 100, 100)
	web, err := a.allocate(mustLabels(t, "k8s:app=web"), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster, web)
	again, err := a.allocate(mustLabels(t, "k8s:app=web"), 0)
	require.NoError(t, err)
	require.Equal(t, web, again, "same labels, same number")

	local, err := a.allocate(cidr(1), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinLocal, local, "CIDR sets stay local")
	mixed, err := a.allocate(mustLabels(t, "app:x,cidr:10.0.0.0/8"), 0)
	require.NoError(t, err)
	require.True(t, mixed.IsLocal(), "a set with a cidr label is local")

	// A request outside the set's space is not honoured.
	db, err := a.allocate(mustLabels(t, "k8s:app=db"), identity.MinLocal+50)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster+1, db)
	other, err := a.allocate(cidr(2), identity.MinCluster+50)
	require.NoError(t, err)
	require.True(t, other.IsLocal())
	requested, err := a.allocate(mustLabels(t, "k8s:app=api"), identity.MinCluster+50)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster+50, requested, "a free requested label number is honoured")

	rows := map[identity.Number]string{}
	for ident := range a.table.All(a.db.ReadTxn()) {
		rows[ident.ID] = ident.Labels.String()
	}
	require.Equal(t, map[identity.Number]string{
		identity.MinCluster: "k8s:app=web", identity.MinCluster + 1: "k8s:app=db", identity.MinCluster + 50: "k8s:app=api",
		identity.MinLocal: "cidr:10.0.1.0/24", identity.MinLocal + 1: "app:x,cidr:10.0.0.0/8", identity.MinLocal + 2: "cidr:10.0.2.0/24",
	}, rows, "the table lists both")
}

func TestNextMovesForwardPerSpace(t *testing.T) {
	a := newSizedAllocator(t, 100, 100)
	web, _ := a.allocate(mustLabels(t, "k8s:app=web"), 0)
	_, err := a.release(web)
	require.NoError(t, err)
	local, _ := a.allocate(cidr(1), 0)
	require.Equal(t, identity.MinLocal, local, "the label space's search does not move the local one's")
	db, _ := a.allocate(mustLabels(t, "k8s:app=db"), 0)
	require.Equal(t, web+1, db, "a label number just freed is not handed out again at once")
}

func TestSpacesExhaustIndependently(t *testing.T) {
	a := newSizedAllocator(t, 2, 2)
	for _, s := range []string{"k8s:app=a", "k8s:app=b"} {
		_, err := a.allocate(mustLabels(t, s), 0)
		require.NoError(t, err)
	}
	_, err := a.allocate(mustLabels(t, "k8s:app=c"), 0)
	require.ErrorIs(t, err, ErrExhausted)
	require.ErrorContains(t, err, "label identity space exhausted")

	// The cluster range is full; CIDR identities still come.
	for n := range 2 {
		id, err := a.allocate(cidr(n), 0)
		require.NoError(t, err)
		require.True(t, id.IsLocal())
	}
	_, err = a.allocate(cidr(3), 0)
	require.ErrorIs(t, err, ErrExhausted)
	require.ErrorContains(t, err, "local identity space exhausted")

	// The local space is full; a freed label number is handed out.
	_, err = a.release(identity.MinCluster)
	require.NoError(t, err)
	id, err := a.allocate(mustLabels(t, "k8s:app=c"), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster, id)

	// And a freed local number, while the label space is full again.
	_, err = a.release(identity.MinLocal + 1)
	require.NoError(t, err)
	id, err = a.allocate(cidr(3), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinLocal+1, id)
}

func TestWithholdForLabels(t *testing.T) {
	a := newSizedAllocator(t, 100, 100)
	web, db := mustLabels(t, "k8s:app=web"), mustLabels(t, "k8s:app=db")
	kept := identity.MinCluster + 10
	previous := map[identity.Number]labels.Labels{
		kept:                web,
		identity.MinLocal:   cidr(1), // a local identity: not withheld for labels
		identity.MinCluster: cidr(2), // not a label set: ignored
	}
	ids, err := a.WithholdForLabels(maps.All(previous))
	require.NoError(t, err)
	require.Equal(t, []identity.Number{kept}, ids)
	require.Equal(t, 1, a.NumWithheld())
	withheld, keptFor := a.WithheldNumber(kept)
	require.True(t, withheld)
	require.Equal(t, web, keptFor)

	// Another set gets neither the number by search nor by naming it.
	other, err := a.allocate(db, kept)
	require.NoError(t, err)
	require.NotEqual(t, kept, other)
	// The set that had it gets it back without naming it, withheld.
	got, err := a.allocate(web, 0)
	require.NoError(t, err)
	require.Equal(t, kept, got)
	row, _, _ := a.table.Get(a.db.ReadTxn(), IdentityIndex.Query(kept))
	require.True(t, row.Withheld())
	// Freed during the grace period, it is still kept for the set.
	_, err = a.release(kept)
	require.NoError(t, err)
	got, err = a.allocate(web, 0)
	require.NoError(t, err)
	require.Equal(t, kept, got)
	_, err = a.release(kept)
	require.NoError(t, err)

	// Un-withheld, it is a number as any other.
	require.NoError(t, a.Unwithhold(ids...))
	require.Equal(t, 0, a.NumWithheld())
	withheld, _ = a.WithheldNumber(kept)
	require.False(t, withheld)
	got, err = a.allocate(mustLabels(t, "k8s:app=api"), kept)
	require.NoError(t, err)
	require.Equal(t, kept, got)
}

func TestExplicitNumbersNotAllocated(t *testing.T) {
	a := newSizedAllocator(t, 100, 3)
	txn := a.WriteTxn()
	a.UseExplicitTxn(txn, identity.MinCluster)
	a.UseExplicitTxn(txn, identity.MinCluster) // two entries use it
	a.UseExplicitTxn(txn, identity.MinLocal)   // outside the cluster range: ignored
	txn.Commit()

	id, err := a.allocate(mustLabels(t, "k8s:app=web"), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster+1, id, "the search skips an explicit identity")
	id, err = a.allocate(mustLabels(t, "k8s:app=db"), identity.MinCluster)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster+2, id, "a request naming an explicit identity does not get it")
	_, err = a.allocate(mustLabels(t, "k8s:app=api"), 0)
	require.ErrorIs(t, err, ErrExhausted, "the explicit identity is not free")
	local, err := a.allocate(cidr(1), identity.MinLocal)
	require.NoError(t, err)
	require.Equal(t, identity.MinLocal, local, "local numbers are not excluded")

	txn = a.WriteTxn()
	a.ReleaseExplicitTxn(txn, identity.MinCluster)
	txn.Commit()
	_, err = a.allocate(mustLabels(t, "k8s:app=api"), 0)
	require.ErrorIs(t, err, ErrExhausted, "one entry still uses it")
	txn = a.WriteTxn()
	a.ReleaseExplicitTxn(txn, identity.MinCluster)
	txn.Commit()
	id, err = a.allocate(mustLabels(t, "k8s:app=api"), 0)
	require.NoError(t, err)
	require.Equal(t, identity.MinCluster, id)
}

func TestCheckpointKeepsLabelIdentities(t *testing.T) {
	path := t.TempDir() + "/" + CheckpointFileName
	saved := map[identity.Number]labels.Labels{
		identity.MinCluster:     mustLabels(t, "k8s:app=web"),
		identity.MinCluster + 7: mustLabels(t, "k8s:app=db"),
		identity.MinLocal:       cidr(1),
		identity.MinLocal + 1:   cidr(2),
	}
	require.NoError(t, writeCheckpoint(path, func(yield func(identity.Number, labels.Labels) bool) {
		for _, id := range []identity.Number{identity.MinCluster, identity.MinCluster + 7, identity.MinLocal, identity.MinLocal + 1} {
			if !yield(id, saved[id]) {
				return
			}
		}
	}))
	checkpoint, err := ReadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, 4, checkpoint.Len())
	for id, want := range saved {
		got, found := checkpoint.Labels(id)
		require.True(t, found, "%d", id)
		require.Equal(t, want, got)
	}
	_, found := checkpoint.Labels(identity.MinCluster + 1)
	require.False(t, found)
	_, found = checkpoint.Labels(identity.MinLocal + 2)
	require.False(t, found)
}
