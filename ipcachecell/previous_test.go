// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// A prefix restore told a previous number for gets it from an owner's
// row that requests none, while the local space is held and after, as
// it did from restore's row; a prefix restore did not tell waits for the
// release and gets a new one.
func TestResolverRequestsThePreviousNumber(t *testing.T) {
	f, _, owner, number, release := newHeldFixture(t)
	told, fresh := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")
	f.ipcache.AddPrevious([]PreviousNumber{{Prefix: told, Number: number}})
	require.NoError(t, owner.UpsertBatch([]PrefixUpsert{{Prefix: told}, {Prefix: fresh}}))

	f.round(t)
	entry, _, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(told))
	require.True(t, found, "resolved while the space is held: its number is withheld for it")
	require.Equal(t, number, entry.Identity)
	require.Contains(t, f.resolver.held, fresh)

	release()
	f.round(t)
	entry, _, found = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(fresh))
	require.True(t, found)
	require.NotEqual(t, number, entry.Identity)

	// An owner's own request wins, as it did over restore's row.
	mine := identity.MinLocal + 9
	app, err := labels.New("k8s:app=x")
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(told, Metadata{Labels: app, RequestedIdentity: mine}))
	f.round(t)
	entry, _, _ = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(told))
	require.Equal(t, mine, entry.Identity)
}

// A told prefix whose last row goes keeps its entry and becomes an
// orphan, for restore to write a row for; once restore forgets, the
// entry of a prefix whose rows go goes.
func TestResolverKeepsAToldPrefixWhoseRowsGo(t *testing.T) {
	f, _, owner, number, release := newHeldFixture(t)
	release()
	p, q := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.3/32")
	f.ipcache.AddPrevious([]PreviousNumber{{Prefix: p, Number: number}})
	require.NoError(t, owner.UpsertBatch([]PrefixUpsert{{Prefix: p}, {Prefix: q}}))
	f.round(t)
	require.Empty(t, f.ipcache.TakeOrphans())

	require.NoError(t, owner.RemoveBatch([]netip.Prefix{p, q}))
	f.round(t)
	entry, _, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
	require.True(t, found, "a told prefix's entry is kept")
	require.Equal(t, number, entry.Identity)
	_, _, found = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(q))
	require.False(t, found, "a prefix restore did not tell goes")
	select {
	case <-f.ipcache.Orphans():
	default:
		t.Fatal("no orphan signalled")
	}
	require.Equal(t, []PreviousNumber{{Prefix: p, Number: number}}, f.ipcache.TakeOrphans())

	// Kept again, then forgotten with the orphan not taken: the caller
	// gets it.
	require.NoError(t, owner.Upsert(p, Metadata{}))
	f.round(t)
	require.NoError(t, owner.Remove(p))
	f.round(t)
	require.Equal(t, []PreviousNumber{{Prefix: p, Number: number}}, f.ipcache.ForgetPrevious())
	require.Nil(t, f.resolver.previous.index, "forgotten")

	require.NoError(t, owner.Upsert(p, Metadata{}))
	f.round(t)
	require.NoError(t, owner.Remove(p))
	f.round(t)
	_, _, found = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
	require.False(t, found, "forgotten: the entry goes with its rows")
	require.Empty(t, f.ipcache.TakeOrphans())
}

// The told prefixes without an entry are those no row asked for.
func TestPreviousWithoutEntry(t *testing.T) {
	f, _, owner, number, release := newHeldFixture(t)
	release()
	asked, notAsked := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")
	f.ipcache.AddPrevious([]PreviousNumber{{Prefix: asked, Number: number}, {Prefix: notAsked, Number: number + 1}})
	require.NoError(t, owner.Upsert(asked, Metadata{}))
	f.round(t)
	require.Equal(t, []PreviousNumber{{Prefix: notAsked, Number: number + 1}}, f.ipcache.PreviousWithoutEntry())
}

// WaitOtherProducers returns once every producer but the named one is
// done, whatever the named one does.
func TestWaitOtherProducers(t *testing.T) {
	f := newFixture(t)
	restoreDone := f.ipcache.RegisterProducer("restore")
	otherDone := f.ipcache.RegisterProducer("other")
	defer restoreDone()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, f.ipcache.WaitOtherProducers(ctx, "restore"), context.DeadlineExceeded,
		"another producer is not done")

	waited := make(chan error, 1)
	go func() { waited <- f.ipcache.WaitOtherProducers(context.Background(), "restore") }()
	otherDone()
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitOtherProducers did not return once the others were done")
	}
}
