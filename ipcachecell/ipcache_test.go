// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"context"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

func mustPrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func upsertAll(t *testing.T, h *Handle, prefixes []netip.Prefix) {
	t.Helper()
	var batch []PrefixUpsert
	for _, p := range prefixes {
		batch = append(batch, PrefixUpsert{Prefix: p})
	}
	require.NoError(t, h.UpsertBatch(batch))
}

func entryPrefixes(entries iter.Seq[*Entry]) []netip.Prefix {
	var out []netip.Prefix
	for e := range entries {
		out = append(out, e.Prefix())
	}
	return out
}

func TestEntriesWithin(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsertAll(t, h, mustPrefixes("0.0.0.0/0", "9.255.255.255/32", "10.0.0.0/8", "10.0.0.0/16", "10.0.0.1/32",
		"10.255.255.255/32", "11.0.0.0/8", "::/0", "::a00:0/104", "2001:db8::/32", "2001:db8:1::/48", "2001:db9::/32"))
	f.round(t)
	txn := f.db.ReadTxn()
	within := func(cidr string) []netip.Prefix {
		return entryPrefixes(EntriesWithin(txn, f.entries, netip.MustParsePrefix(cidr)))
	}

	require.Equal(t, mustPrefixes("10.0.0.0/8", "10.0.0.0/16", "10.0.0.1/32", "10.255.255.255/32"), within("10.0.0.0/8"))
	require.Equal(t, mustPrefixes("10.0.0.0/16", "10.0.0.1/32"), within("10.0.0.0/16"))
	require.Equal(t, mustPrefixes("10.0.0.1/32"), within("10.0.0.1/32"))
	require.Empty(t, within("10.0.0.2/32"))
	require.Equal(t, mustPrefixes("0.0.0.0/0", "9.255.255.255/32", "10.0.0.0/8", "10.0.0.0/16", "10.0.0.1/32",
		"10.255.255.255/32", "11.0.0.0/8"), within("0.0.0.0/0"), "IPv4 only")
	require.Equal(t, mustPrefixes("2001:db8::/32", "2001:db8:1::/48"), within("2001:db8::/32"))
	require.Len(t, within("::/0"), 5, "IPv6 only; an IPv4-mapped-like IPv6 prefix stays IPv6")
	require.Equal(t, mustPrefixes("10.0.0.0/16", "10.0.0.1/32"), within("10.0.5.5/16"), "host bits of the query are cleared")
}

func TestLookupAddressLongestMatch(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsertAll(t, h, mustPrefixes("10.0.0.0/8", "10.1.0.0/16", "10.1.1.1/32", "2001:db8::/32", "::/0"))
	f.round(t)
	txn := f.db.ReadTxn()
	for addr, want := range map[string]string{
		"10.1.1.1": "10.1.1.1/32", "10.1.1.2": "10.1.0.0/16", "10.2.0.0": "10.0.0.0/8",
		"2001:db8::1": "2001:db8::/32", "2001:db9::1": "::/0",
	} {
		entry, found := LookupAddress(txn, f.entries, netip.MustParseAddr(addr))
		require.True(t, found, addr)
		require.Equal(t, want, entry.Prefix().String(), addr)
	}
	_, found := LookupAddress(txn, f.entries, netip.MustParseAddr("192.0.2.1"))
	require.False(t, found)
}

func TestHandleErrors(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("policy/a", source.Directory)
	require.NoError(t, err)

	_, err = f.ipcache.NewHandle("policy/a", source.Directory)
	require.ErrorIs(t, err, ErrResourceInUse)
	_, err = f.ipcache.NewHandle("", source.Directory)
	require.ErrorIs(t, err, ErrInvalidMetadata)
	_, err = f.ipcache.NewHandle("x", source.Source(0))
	require.ErrorIs(t, err, source.ErrUnknownSource)

	// A batch with one bad entry writes nothing.
	err = h.UpsertBatch([]PrefixUpsert{
		{Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		{Prefix: netip.Prefix{}},
	})
	require.ErrorIs(t, err, ErrInvalidMetadata)
	err = h.Upsert(netip.MustParsePrefix("10.0.0.0/8"), Metadata{RequestedIdentity: 2})
	require.ErrorIs(t, err, ErrInvalidMetadata)
	require.Zero(t, f.metadata.NumObjects(f.db.ReadTxn()))

	require.NoError(t, h.Release())
	require.ErrorIs(t, h.Release(), ErrHandleReleased)
	require.ErrorIs(t, h.Upsert(netip.MustParsePrefix("10.0.0.0/8"), Metadata{}), ErrHandleReleased)
	_, err = f.ipcache.NewHandle("policy/a", source.Directory)
	require.NoError(t, err, "a released resource can get a new handle")
}

func TestLargeBatchIsChunkedAndComplete(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	prefixes := hostPrefixes(0, 3*writeChunkSize+7)
	upsertAll(t, h, prefixes)
	f.round(t)
	txn := f.db.ReadTxn()
	require.Equal(t, len(prefixes), f.entries.NumObjects(txn))
	require.Equal(t, len(prefixes), f.identities.NumObjects(txn))

	require.NoError(t, h.Release())
	f.round(t)
	txn = f.db.ReadTxn()
	require.Zero(t, f.entries.NumObjects(txn))
	require.Zero(t, f.identities.NumObjects(txn))
}

// TestInitializedAfterProducersAndResolution: the `ipcache` table is
// initialized only once every registered producer is done and what they
// wrote is resolved.
func TestInitializedAfterProducersAndResolution(t *testing.T) {
	f := newFixture(t)
	restoreDone := f.ipcache.RegisterProducer("restore")
	policiesDone := f.ipcache.RegisterProducer("policies")
	initialized := func() bool {
		init, _ := f.entries.Initialized(f.db.ReadTxn())
		return init
	}

	h, err := f.ipcache.NewHandle("restore", source.Restored)
	require.NoError(t, err)
	upsertAll(t, h, mustPrefixes("10.0.0.0/8"))
	restoreDone()
	f.round(t)
	require.False(t, initialized(), "policies are not done")

	policiesDone()
	require.False(t, initialized(), "done, but not yet resolved")
	f.round(t)
	require.True(t, initialized())
	require.Equal(t, 1, f.entries.NumObjects(f.db.ReadTxn()), "everything written before is resolved")
}

func BenchmarkLookupAddress(b *testing.B) {
	f := newFixture(b)
	h, err := f.ipcache.NewHandle("bench", source.Local)
	require.NoError(b, err)
	var batch []PrefixUpsert
	for i := range 100_000 {
		v4 := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		v6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 12: byte(i >> 16), 13: byte(i >> 8), 14: byte(i)})
		batch = append(batch, PrefixUpsert{Prefix: netip.PrefixFrom(v4, 32)}, PrefixUpsert{Prefix: netip.PrefixFrom(v6, 120)})
	}
	batch = append(batch, PrefixUpsert{Prefix: netip.MustParsePrefix("0.0.0.0/0")}, PrefixUpsert{Prefix: netip.MustParsePrefix("::/0")})
	require.NoError(b, h.UpsertBatch(batch))
	f.round(b)
	txn := f.db.ReadTxn()
	for name, addr := range map[string]string{
		"ipv4-host": "10.0.1.2", "ipv4-default-route": "192.0.2.1",
		"ipv6-/120": "2001:db8::1:2:5", "ipv6-default-route": "2001:db9::1",
	} {
		b.Run(name, func(b *testing.B) {
			a := netip.MustParseAddr(addr)
			for b.Loop() {
				if _, found := LookupAddress(txn, f.entries, a); !found {
					b.Fatal("not found")
				}
			}
		})
	}
}

// A batch is written in address order, but among rows of one prefix the
// last in the batch is what the resource says.
func TestUpsertBatchLastRowOfAPrefixWins(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	var batch []PrefixUpsert
	// Many rows, out of order, each prefix three times: the sort is not
	// trivially stable by accident of a small input.
	for round := range 3 {
		for i := 255; i >= 0; i-- {
			prefix := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 1}), 32)
			batch = append(batch, PrefixUpsert{Prefix: prefix,
				Metadata: Metadata{RequestedIdentity: identity.MinLocal + identity.Number(round*256+i)}})
		}
	}
	require.NoError(t, h.UpsertBatch(batch))
	txn := f.db.ReadTxn()
	require.Equal(t, 256, f.metadata.NumObjects(txn))
	for row := range f.metadata.All(txn) {
		i := int(row.Prefix().Addr().As4()[2])
		require.Equal(t, identity.MinLocal+identity.Number(2*256+i), row.Metadata().RequestedIdentity,
			"prefix %s", row.Prefix())
	}
}

// An owner re-asserting a restored prefix changes the entry's source, not
// its identity (the datapath's writer then has the same value to write);
// new labels give it a new identity.
func TestEntryKeepsIdentityWhenSourceChanges(t *testing.T) {
	f := newFixture(t)
	prefix := netip.MustParsePrefix("10.0.0.1/32")
	restored, err := f.ipcache.NewHandle("restored", source.Restored)
	require.NoError(t, err)
	require.NoError(t, restored.Upsert(prefix, Metadata{RequestedIdentity: identity.MinLocal + 7}))
	f.round(t)
	_, restoredRev, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(prefix))
	require.True(t, found)

	// The owner re-asserts the prefix: the source changes, the identity
	// does not.
	owner, err := f.ipcache.NewHandle("owner", source.Local)
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(prefix, Metadata{}))
	f.round(t)
	entry, ownerRev, _ := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(prefix))
	require.Equal(t, source.Local, entry.Source)
	require.Equal(t, identity.MinLocal+7, entry.Identity)
	require.Greater(t, ownerRev, restoredRev, "a new revision of the same mapping")

	// New labels, a new identity (restore no longer asks for the old
	// number): the datapath has to write it.
	require.NoError(t, restored.Release())
	appX, err := labels.Parse("app:x")
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(prefix, Metadata{Labels: appX}))
	f.round(t)
	entry, _, _ = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(prefix))
	require.NotEqual(t, identity.MinLocal+7, entry.Identity)
}

// A gradual release removes a chunk at a time, each within the rate; when
// its context ends, the rows not yet removed and the handle stay.
// The handle knows its rows (there is no index by resource): what it
// upserts, re-upserts and removes, and a release removes exactly them;
// with its set of prefixes, and past maxKnown without (a scan of the
// table finds them).
func TestHandleKnowsItsRows(t *testing.T) {
	for _, maxKnown := range []int{maxKnownPrefixes, 1} {
		t.Run(fmt.Sprint("maxKnown=", maxKnown), func(t *testing.T) {
			f := newFixture(t)
			a, err := f.ipcache.NewHandle("a", source.Local)
			require.NoError(t, err)
			a.maxKnown = maxKnown
			b, err := f.ipcache.NewHandle("b", source.Directory)
			require.NoError(t, err)
			upsertAll(t, a, mustPrefixes("10.0.0.0/8", "10.0.0.1/32", "2001:db8::/32", "10.0.0.0/8"))
			upsertAll(t, b, mustPrefixes("10.0.0.1/32", "2001:db8::/32", "::ffff:10.0.0.0/104"))
			require.Equal(t, maxKnown > 1, a.prefixes != nil, "the set is kept up to maxKnown prefixes")
			require.Equal(t, 3, a.NumPrefixes(), "a prefix upserted twice is one row")
			require.NoError(t, a.RemoveBatch(mustPrefixes("10.0.0.1/32", "192.0.2.0/24")))
			require.Equal(t, 2, a.NumPrefixes(), "removing what the resource does not have changes nothing")
			require.Equal(t, 5, f.metadata.NumObjects(f.db.ReadTxn()))

			require.NoError(t, a.Release())
			require.Zero(t, a.NumPrefixes())
			var left []string
			for row := range f.metadata.All(f.db.ReadTxn()) {
				left = append(left, row.Resource()+" "+row.Prefix().String())
			}
			require.Equal(t, []string{"b 10.0.0.1/32", "b ::ffff:10.0.0.0/104", "b 2001:db8::/32"}, left,
				"the IPv4 prefix and its IPv4-mapped IPv6 look-alike are different prefixes")
			require.Equal(t, 3, b.NumPrefixes())
		})
	}
}

func TestReleaseGraduallyStopsWithItsContext(t *testing.T) {
	for _, maxKnown := range []int{maxKnownPrefixes, releaseChunkSize} {
		t.Run(fmt.Sprint("maxKnown=", maxKnown), func(t *testing.T) { testReleaseGraduallyStops(t, maxKnown) })
	}
}

func testReleaseGraduallyStops(t *testing.T, maxKnown int) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	h.maxKnown = maxKnown
	prefixes := hostPrefixes(0, 3*releaseChunkSize+10)
	upsertAll(t, h, prefixes)

	// The first chunk goes at once; the next would wait a second, past
	// the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.Error(t, h.ReleaseGradually(ctx, releaseChunkSize), "the wait would pass the deadline")
	require.Equal(t, 2*releaseChunkSize+10, f.metadata.NumObjects(f.db.ReadTxn()))
	require.Equal(t, 2*releaseChunkSize+10, h.NumPrefixes())
	require.NoError(t, h.Upsert(prefixes[0], Metadata{}), "the handle is not released")
	require.Equal(t, 2*releaseChunkSize+11, h.NumPrefixes())

	require.NoError(t, h.ReleaseGradually(context.Background(), 1_000_000))
	require.Zero(t, f.metadata.NumObjects(f.db.ReadTxn()))
	require.Zero(t, h.NumPrefixes())
	require.ErrorIs(t, h.Upsert(prefixes[0], Metadata{}), ErrHandleReleased)
}

// A handle without its set releases by a scan a chunk at a time: across
// the chunks' bounds, every row of its own goes and no other resource's
// row of the same prefixes does.
func TestReleaseByScanAcrossChunks(t *testing.T) {
	f := newFixture(t)
	a, err := f.ipcache.NewHandle("a", source.Local)
	require.NoError(t, err)
	a.maxKnown = 1
	b, err := f.ipcache.NewHandle("b", source.Directory)
	require.NoError(t, err)
	n := 2*releaseChunkSize + 5
	upsertAll(t, a, hostPrefixes(0, n))
	upsertAll(t, b, hostPrefixes(releaseChunkSize-3, 10))
	upsertAll(t, b, hostPrefixes(n-1, 2))
	require.Nil(t, a.prefixes)

	require.NoError(t, a.Release())
	require.Zero(t, a.NumPrefixes())
	left := 0
	for row := range f.metadata.All(f.db.ReadTxn()) {
		require.Equal(t, "b", row.Resource())
		left++
	}
	require.Equal(t, 12, left)
	require.Equal(t, 12, b.NumPrefixes())
}

// A row's key is its prefix's followed by the resource's id: an IPv4 key
// fits in 8 bytes, with ids of two bytes a prefix query still finds
// exactly the prefix's rows and a release exactly the resource's, and a
// released resource's id is the next handle's, so that names that come
// and go do not grow the IPCache.
func TestMetadataKeysByResourceID(t *testing.T) {
	f := newFixture(t)
	p1, p2 := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")
	const n = 300 // ids from 128 on take two bytes
	handles := make([]*Handle, n)
	for i := range handles {
		h, err := f.ipcache.NewHandle(fmt.Sprintf("r%03d", i), source.Local)
		require.NoError(t, err)
		require.EqualValues(t, i, h.owner.id)
		upsertAll(t, h, []netip.Prefix{p1, p2})
		handles[i] = h
	}
	require.Len(t, metadataKey(nil, p1, 127), 7)
	require.Len(t, metadataKey(nil, p1, 16383), 8)
	require.Len(t, metadataKey(nil, netip.MustParsePrefix("2001:db8::/32"), 200), 20)

	resourcesOf := func(prefix netip.Prefix) []string {
		var out []string
		for row := range f.metadata.Prefix(f.db.ReadTxn(), MetadataIndex.Query(prefix)) {
			require.Equal(t, prefix, row.Prefix())
			out = append(out, row.Resource())
		}
		slices.Sort(out)
		return out
	}
	require.Len(t, resourcesOf(p1), n)
	require.Len(t, resourcesOf(p2), n)

	// r200 goes, and comes back with another source: it takes the id
	// freed (the only one), and its rows are written, found and released
	// as before.
	require.NoError(t, handles[200].Release())
	require.Len(t, resourcesOf(p1), n-1)
	require.NotContains(t, resourcesOf(p2), "r200")
	again, err := f.ipcache.NewHandle("r200", source.Directory)
	require.NoError(t, err)
	require.EqualValues(t, 200, again.owner.id)
	upsertAll(t, again, []netip.Prefix{p2})
	require.Contains(t, resourcesOf(p2), "r200")
	row, _, found := f.metadata.Get(f.db.ReadTxn(), MetadataIndex.QueryFromKey(metadataKey(nil, p2, 200)))
	require.True(t, found)
	require.Equal(t, source.Directory, row.Source())
	require.NoError(t, again.Remove(p2))
	require.NotContains(t, resourcesOf(p2), "r200")
	require.Len(t, resourcesOf(p2), n-1)

	// A thousand names, one after the other, each released: each takes
	// the id freed before it, and the IPCache keeps no name once released.
	require.NoError(t, again.Release())
	for i := range 1000 {
		h, err := f.ipcache.NewHandle(fmt.Sprintf("workload-%d", i), source.Local)
		require.NoError(t, err)
		require.EqualValues(t, 200, h.owner.id, "workload-%d", i)
		upsertAll(t, h, []netip.Prefix{p1})
		require.Len(t, resourcesOf(p1), n)
		require.NoError(t, h.Release())
	}
	require.Len(t, resourcesOf(p1), n-1)
	require.Len(t, f.ipcache.live, n-1, "the live resources only")
	require.EqualValues(t, n, f.ipcache.nextID, "no id beyond the most resources live at once")
}
