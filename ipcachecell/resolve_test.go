// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

func hostPrefixes(first, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		out[i] = netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.%d/32", (first+i)>>16&0xff, (first+i)>>8&0xff, (first+i)&0xff))
	}
	return out
}

func addAll(q *resolveQueue, resource string, prefixes []netip.Prefix) {
	for _, p := range prefixes {
		q.add(resource, p, 1)
	}
}

// nextPrefixes is the prefixes of q's next chunk of up to n.
func nextPrefixes(q *resolveQueue, n int) []netip.Prefix {
	var out []netip.Prefix
	for _, queued := range q.next(n) {
		out = append(out, queued.key.prefix())
	}
	return out
}

// Another owner's single change, queued behind a large release, is in the
// next chunk; the release still progresses in every chunk.
func TestResolveQueueSharesChunksAmongOwners(t *testing.T) {
	var q resolveQueue
	addAll(&q, "restore", hostPrefixes(0, 10_000))
	require.Equal(t, hostPrefixes(0, 100), nextPrefixes(&q, 100), "a lone lane is first in, first out")

	single := netip.MustParsePrefix("192.0.2.1/32")
	q.add("policy/a", single, 2)
	addAll(&q, "restore", hostPrefixes(20_000, 1000)) // committed after it
	chunk := nextPrefixes(&q, 100)
	require.Contains(t, chunk, single)
	require.Subset(t, chunk, hostPrefixes(100, 99), "the rest of the chunk is the release, in order")
	require.True(t, slices.IsSortedFunc(chunk, prefixkey.Compare), "a chunk is in address order")

	addAll(&q, "policy/b", hostPrefixes(50_000, 1000))
	chunk = nextPrefixes(&q, 100)
	require.Subset(t, chunk, hostPrefixes(199, 50), "two busy owners share a chunk")
	require.Subset(t, chunk, hostPrefixes(50_000, 50))
}

// A prefix queued twice (by one owner or two) is in a chunk once, with its
// latest change; after it is taken, it can be queued again (it changed
// again).
func TestResolveQueueDeduplicates(t *testing.T) {
	var q resolveQueue
	p := netip.MustParsePrefix("10.0.0.1/32")
	other := netip.MustParsePrefix("10.0.0.0/32")
	q.add("a", p, 1)
	q.add("a", other, 2)
	q.add("a", p, 3)
	q.add("b", p, 4)
	require.Equal(t, []queuedPrefix{{compact(other), 2}, {compact(p), 4}}, q.next(10))
	require.Empty(t, q.next(10))
	q.add("b", p, 5)
	require.Equal(t, []queuedPrefix{{compact(p), 5}}, q.next(10))
}

// sortByPrefix orders a batch's positions as prefixkey.Compare orders
// their prefixes (IPv4 before IPv6, then address, then length) and keeps
// the batch's order among positions of one prefix, as a stable sort would.
func TestOrderByPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var prefixes []netip.Prefix
	for range 5000 {
		var addr netip.Addr
		if rng.IntN(2) == 0 {
			addr = netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(4)), byte(rng.IntN(256))})
		} else {
			addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(rng.IntN(256))})
			if rng.IntN(4) == 0 {
				addr = netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: 10, 15: byte(rng.IntN(256))}) // IPv4-mapped: IPv6
			}
		}
		prefixes = append(prefixes, netip.PrefixFrom(addr, rng.IntN(addr.BitLen()+1)).Masked())
	}
	want := make([]int, len(prefixes))
	for i := range want {
		want[i] = i
	}
	slices.SortStableFunc(want, func(a, b int) int { return prefixkey.Compare(prefixes[a], prefixes[b]) })
	require.Equal(t, want, positionsByPrefix(prefixes))
	// A small batch is sorted by comparison, a large one by radix
	// (minRadixSort): both in the same order.
	small := prefixes[:minRadixSort/2]
	wantSmall := slices.DeleteFunc(slices.Clone(want), func(i int) bool { return i >= len(small) })
	require.Equal(t, wantSmall, positionsByPrefix(small))
	// sortByPrefix gives each position's prefix back as it was (IPv4,
	// IPv6, IPv4-mapped IPv6), and its mark, whatever the mark does to
	// nothing of the order.
	sorted3 := sortByPrefix(len(prefixes), func(i int) (netip.Prefix, bool) { return prefixes[i], i%3 == 0 })
	for k, o := range sorted3 {
		require.Equal(t, want[k], o.position())
		require.Equal(t, prefixes[o.position()], o.prefix(), "position %d", o.position())
		require.Equal(t, o.position()%3 == 0, o.marked(), "position %d", o.position())
	}

	// A sorted batch keeps its order.
	sorted := make([]netip.Prefix, len(prefixes))
	for k, i := range want {
		sorted[k] = prefixes[i]
	}
	identityOrder := make([]int, len(sorted))
	for i := range identityOrder {
		identityOrder[i] = i
	}
	require.Equal(t, identityOrder, positionsByPrefix(sorted))
}

// positionsByPrefix returns the batch's positions in sortByPrefix's order.
func positionsByPrefix(prefixes []netip.Prefix) []int {
	var order []int
	for _, o := range sortByPrefix(len(prefixes), func(i int) (netip.Prefix, bool) { return prefixes[i], false }) {
		order = append(order, o.position())
	}
	return order
}

// A prefix that two owners queued, taken in two chunks (a restart:
// restore's row and the owner's re-assertion), is resolved once, for the
// later change; so is one changed twice by the same owner, and a deletion
// superseded by a later upsert.
func TestResolverResolvesPrefixQueuedTwiceOnce(t *testing.T) {
	f := newFixture(t)
	f.resolver.chunkSize, f.resolver.maxChunkSize = 1, 1
	p := netip.MustParsePrefix("10.0.0.1/32")
	restore, err := f.ipcache.NewHandle("restore", source.Restored)
	require.NoError(t, err)
	owner, err := f.ipcache.NewHandle("owner", source.Local)
	require.NoError(t, err)
	require.NoError(t, restore.Upsert(p, Metadata{Labels: labels.ForPrefix(p), RequestedIdentity: identity.MinLocal + 7}))
	require.NoError(t, owner.Upsert(p, Metadata{}))
	f.round(t)
	require.Equal(t, 1, f.resolver.resolutions, "restore's change is superseded by the owner's")
	entry, _, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
	require.True(t, found)
	require.Equal(t, source.Local, entry.Source)
	require.Equal(t, identity.MinLocal+7, entry.Identity, "restore's row was merged")

	appLabels, err := labels.New("app:x")
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(p, Metadata{}))
	require.NoError(t, owner.Upsert(p, Metadata{Labels: appLabels}))
	f.round(t)
	require.Equal(t, 2, f.resolver.resolutions, "a row changed twice between rounds: one change")
	entry, _, _ = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
	got, _ := f.allocator.LabelsTxn(f.db.ReadTxn(), entry.Identity)
	require.Equal(t, labels.ForPrefix(p).Union(appLabels), got)

	require.NoError(t, restore.Remove(p))
	require.NoError(t, owner.Upsert(p, Metadata{}))
	f.round(t)
	require.Equal(t, 3, f.resolver.resolutions, "a deletion superseded by a later upsert")
	entry, _, _ = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
	got, _ = f.allocator.LabelsTxn(f.db.ReadTxn(), entry.Identity)
	require.Equal(t, labels.ForPrefix(p), got)

	require.NoError(t, owner.Remove(p))
	f.round(t)
	require.Equal(t, 4, f.resolver.resolutions)
	require.Zero(t, f.entries.NumObjects(f.db.ReadTxn()))
}

// A lane is first in, first out across its blocks, however pushes and
// takes interleave.
func TestResolveLaneIsFIFO(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var (
		l         lane
		want, got []queuedPrefix
		pushed    int
	)
	for range 200 {
		for range rng.IntN(3 * maxLaneBlock) {
			addr := netip.AddrFrom4([4]byte{10, byte(pushed >> 16), byte(pushed >> 8), byte(pushed)})
			p := queuedPrefix{compact(netip.PrefixFrom(addr, 32)), uint64(pushed)}
			l.push(p)
			want = append(want, p)
			pushed++
		}
		got = l.take(rng.IntN(3*maxLaneBlock), got)
		require.Equal(t, len(want)-len(got), l.n)
	}
	got = l.take(l.n+1, got)
	require.Equal(t, want, got)
	require.Zero(t, l.n)
	require.Empty(t, l.blocks)
}

// A chunk's metadata is read ahead of its write (see resolver.round): a
// change committed between the read and the write is written stale by
// that chunk, and resolved again, to the latest metadata, from the change
// iterator in the same round.
func TestResolverResolvesChangeBetweenReadAndWrite(t *testing.T) {
	f := newFixture(t)
	p := netip.MustParsePrefix("10.0.0.1/32")
	owner, err := f.ipcache.NewHandle("owner", source.Local)
	require.NoError(t, err)
	labelsOf := func(s string) labels.Labels {
		l, err := labels.New(s)
		require.NoError(t, err)
		return l
	}
	entryLabels := func() labels.Labels {
		entry, _, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
		require.True(t, found)
		got, _ := f.allocator.LabelsTxn(f.db.ReadTxn(), entry.Identity)
		return got
	}
	require.NoError(t, owner.Upsert(p, Metadata{Labels: labelsOf("app:a")}))
	f.round(t)
	require.Equal(t, labelsOf("app:a").Union(labels.ForPrefix(p)), entryLabels())

	require.NoError(t, owner.Upsert(p, Metadata{Labels: labelsOf("app:b")}))
	// Queued as the round would: with the revision of app:b's change.
	read := <-f.resolver.prefetch([]queuedPrefix{{compact(p), f.metadata.Revision(f.db.ReadTxn())}})
	require.NoError(t, owner.Upsert(p, Metadata{Labels: labelsOf("app:c")}))
	f.resolver.write(read, time.Now(), nil)
	require.Equal(t, labelsOf("app:b").Union(labels.ForPrefix(p)), entryLabels(), "written as read")

	resolutions := f.resolver.resolutions
	f.round(t)
	require.Equal(t, labelsOf("app:c").Union(labels.ForPrefix(p)), entryLabels(), "the later change resolved again")
	require.Equal(t, resolutions+1, f.resolver.resolutions, "app:b's change superseded by app:c's")
	require.Empty(t, f.resolver.failed)
}

// Among owners of one source, the resource first by name sets the
// requested and the explicit identity, whichever got its handle first
// (a prefix's rows are in the order of the resources' ids, not names).
func TestMergeTieGoesToResourceFirstByName(t *testing.T) {
	f := newFixture(t)
	requested := netip.MustParsePrefix("10.0.0.1/32")
	explicit := netip.MustParsePrefix("10.0.0.2/32")
	// "b" gets its handle, and so its id, first.
	b, err := f.ipcache.NewHandle("b", source.Local)
	require.NoError(t, err)
	a, err := f.ipcache.NewHandle("a", source.Local)
	require.NoError(t, err)
	require.NoError(t, b.Upsert(requested, Metadata{RequestedIdentity: identity.MinLocal + 2}))
	require.NoError(t, a.Upsert(requested, Metadata{RequestedIdentity: identity.MinLocal + 1}))
	require.NoError(t, b.Upsert(explicit, Metadata{ExplicitIdentity: 5002}))
	require.NoError(t, a.Upsert(explicit, Metadata{ExplicitIdentity: 5001}))
	f.round(t)

	txn := f.db.ReadTxn()
	var order []string
	for row := range f.metadata.Prefix(txn, MetadataIndex.Query(requested)) {
		order = append(order, row.Resource())
	}
	require.Equal(t, []string{"b", "a"}, order, "rows in id order")
	entry, _, found := f.entries.Get(txn, EntryIndex.Query(requested))
	require.True(t, found)
	require.Equal(t, identity.MinLocal+1, entry.Identity, "a's request")
	entry, _, found = f.entries.Get(txn, EntryIndex.Query(explicit))
	require.True(t, found)
	require.Equal(t, identity.Number(5001), entry.Identity, "a's explicit identity")

	// A source of higher precedence still wins over the name.
	c, err := f.ipcache.NewHandle("c", source.KubeAPIServer)
	require.NoError(t, err)
	third := netip.MustParsePrefix("10.0.0.3/32")
	require.NoError(t, a.Upsert(third, Metadata{RequestedIdentity: identity.MinLocal + 4}))
	require.NoError(t, c.Upsert(third, Metadata{RequestedIdentity: identity.MinLocal + 3}))
	f.round(t)
	entry, _, found = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(third))
	require.True(t, found)
	require.Equal(t, identity.MinLocal+3, entry.Identity, "c's request")
}

// The queue orders compact prefixes as prefixkey orders prefixes (the
// order the datapath writes fastest in), for both families and every
// length, and a compact prefix gives back the prefix it was made of.
func TestCompactPrefixOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	random := func() netip.Prefix {
		if rng.IntN(2) == 0 {
			addr := netip.AddrFrom4([4]byte{byte(rng.IntN(3)), 0, byte(rng.IntN(2)), byte(rng.IntN(256))})
			return netip.PrefixFrom(addr, rng.IntN(33)).Masked()
		}
		var a [16]byte
		a[0], a[15] = byte(rng.IntN(3)), byte(rng.IntN(256))
		return netip.PrefixFrom(netip.AddrFrom16(a), rng.IntN(129)).Masked()
	}
	sign := func(c int) int { return min(max(c, -1), 1) }
	for range 10_000 {
		a, b := random(), random()
		require.Equal(t, a, compact(a).prefix())
		require.Equal(t, sign(prefixkey.Compare(a, b)), sign(compact(a).compare(compact(b))), "%s, %s", a, b)
	}
}

// While the allocator's local space is held (restore still withholding
// the previous run's numbers), a prefix restore gave its number is
// resolved, and one that needs a new number waits: no entry, no
// resolution reported, the tables not initialized. Once the space is
// released, the next round resolves it.
func TestResolverHoldsPrefixesNeedingANewNumber(t *testing.T) {
	f, restore, owner, number, release := newHeldFixture(t)
	restored, fresh := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")
	require.NoError(t, restore.Upsert(restored, Metadata{Labels: labels.ForPrefix(restored), RequestedIdentity: number}))
	require.NoError(t, owner.Upsert(restored, Metadata{}))
	require.NoError(t, owner.Upsert(fresh, Metadata{}))
	revision := f.metadata.Revision(f.db.ReadTxn())

	f.round(t)
	entry, _, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(restored))
	require.True(t, found, "the restored prefix is resolved while the space is held")
	require.Equal(t, number, entry.Identity)
	_, _, found = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(fresh))
	require.False(t, found, "a new number waits for the release")
	require.Contains(t, f.resolver.held, fresh)
	require.Empty(t, f.resolver.failed, "waiting is no failure")
	reported, _ := f.resolver.resolved.Get()
	require.Less(t, reported, revision, "not reported resolved")

	release()
	f.round(t)
	entry, _, found = f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(fresh))
	require.True(t, found, "resolved once the space is released")
	require.True(t, entry.Identity.IsLocal())
	require.NotEqual(t, number, entry.Identity)
	require.Empty(t, f.resolver.held)
	reported, _ = f.resolver.resolved.Get()
	require.GreaterOrEqual(t, reported, revision)
}

// A chunk read while restore still writes its rows, and written after
// restore has released the local space, is read again: from the first
// read, the prefix would take a new number (restore's row was missing)
// and keep it.
func TestResolverReadsAgainAChunkReadWhileHeld(t *testing.T) {
	f, restore, owner, number, release := newHeldFixture(t)
	p := netip.MustParsePrefix("10.0.0.1/32")
	require.NoError(t, owner.Upsert(p, Metadata{}))
	read := <-f.resolver.prefetch([]queuedPrefix{{compact(p), f.metadata.Revision(f.db.ReadTxn())}})
	require.True(t, read.whileHeld)

	require.NoError(t, restore.Upsert(p, Metadata{Labels: labels.ForPrefix(p), RequestedIdentity: number}))
	release()
	f.resolver.write(read, time.Now(), nil)
	// Read again, the owner's change is superseded by restore's, which
	// the round resolves.
	f.round(t)
	entry, _, found := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(p))
	require.True(t, found)
	require.Equal(t, number, entry.Identity, "the restored number, not one taken from the first read")
}

// newHeldFixture is a fixture whose allocator's local space is held, as
// restore holds it: one number withheld, restore's and an owner's handle.
func newHeldFixture(t *testing.T) (f *fixture, restore, owner *Handle, number identity.Number, release func()) {
	f = newFixture(t)
	number = identity.MinLocal + 7
	require.NoError(t, f.allocator.Withhold(number))
	release = f.allocator.HoldLocal()
	restore, err := f.ipcache.NewHandle("restore", source.Restored)
	require.NoError(t, err)
	owner, err = f.ipcache.NewHandle("owner", source.Local)
	require.NoError(t, err)
	return f, restore, owner, number, release
}

// BenchmarkSortByPrefix sorts a million random prefixes' positions (a
// large owner's batch: IPv4 /32s, or half of them IPv6 /128s) by
// comparison and by radix (radixSort), each from the same unsorted copy.
func BenchmarkSortByPrefix(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, family := range []string{"ipv4", "mixed"} {
		prefixes := make([]netip.Prefix, 1_000_000)
		for i := range prefixes {
			var a [16]byte
			for j := range a {
				a[j] = byte(rng.Uint32())
			}
			prefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), 32)
			if family == "mixed" && i%2 == 1 {
				prefixes[i] = netip.PrefixFrom(netip.AddrFrom16(a), 128)
			}
		}
		unsorted := sortByPrefix(len(prefixes), func(i int) (netip.Prefix, bool) { return prefixes[i], false })
		rng.Shuffle(len(unsorted), func(i, j int) { unsorted[i], unsorted[j] = unsorted[j], unsorted[i] })
		work := make([]positioned, len(unsorted))
		b.Run(family+"/comparison", func(b *testing.B) {
			for b.Loop() {
				copy(work, unsorted)
				slices.SortFunc(work, comparePositioned)
			}
		})
		b.Run(family+"/radix", func(b *testing.B) {
			for b.Loop() {
				copy(work, unsorted)
				radixSort(work)
			}
		})
	}
}

// readRows merges the same rows into a chunk as a search per prefix
// does, whether its walk passes them all (a run of adjacent prefixes) or
// seeks again (runs apart, a chunk spread over other prefixes), with prefixes that
// have no row (before, between and after the table's), rows of two
// resources, both families, and a prefix whose row is newer than its
// change.
func TestReadRowsMatchesSearchPerPrefix(t *testing.T) {
	f := newFixture(t)
	a, err := f.ipcache.NewHandle("a", source.Local)
	require.NoError(t, err)
	b, err := f.ipcache.NewHandle("b", source.Restored)
	require.NoError(t, err)
	appLabels, err := labels.New("app:x")
	require.NoError(t, err)

	prefixes := hostPrefixes(1, 2000)
	for i := range 200 {
		prefixes = append(prefixes, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 15: byte(i)}), 128))
	}
	var upserts []PrefixUpsert
	for i, p := range prefixes {
		if i%7 == 3 {
			continue // no row
		}
		upserts = append(upserts, PrefixUpsert{Prefix: p})
	}
	require.NoError(t, a.UpsertBatch(upserts))
	for i, p := range prefixes {
		if i%3 == 0 {
			require.NoError(t, b.Upsert(p, Metadata{Labels: appLabels, RequestedIdentity: identity.MinLocal + identity.Number(i)}))
		}
	}
	queuedAt := f.metadata.Revision(f.db.ReadTxn())
	newer := prefixes[30]
	require.NoError(t, a.Upsert(newer, Metadata{Labels: appLabels}))

	outside := []netip.Prefix{netip.MustParsePrefix("9.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("2001::/16"), netip.MustParsePrefix("ffff::/16")}
	chunks := map[string][]netip.Prefix{
		"adjacent":          prefixes[:600],
		"spread":            everyNth(prefixes, 40),
		"spread then dense": append(everyNth(prefixes[:1800], 100), prefixes[1800:1850]...),
		"two runs":          append(slices.Clone(prefixes[100:300]), prefixes[1500:1700]...),
		"no rows":           outside,
		"with outside":      append(slices.Clone(prefixes[20:40]), outside...),
		"one, superseded":   prefixes[30:31],
	}
	for name, chunk := range chunks {
		t.Run(name, func(t *testing.T) {
			chunk = slices.Clone(chunk)
			slices.SortFunc(chunk, func(x, y netip.Prefix) int { return compact(x).compare(compact(y)) })
			txn := f.db.ReadTxn()
			got := make([]prefetched, len(chunk))
			want := make([]prefetched, len(chunk))
			for i, p := range chunk {
				got[i] = prefetched{prefix: p, changed: queuedAt}
				want[i] = got[i]
			}
			f.resolver.readRows(txn, got)
			for i := range want {
				w := &want[i]
				for row, revision := range f.metadata.Prefix(txn, MetadataIndex.Query(w.prefix)) {
					if revision > w.changed {
						w.superseded = true
						break
					}
					w.res.merge(row)
				}
			}
			require.Equal(t, want, got)
			read := 0
			for _, p := range got {
				if p.res.hasAnyMetadataRow || p.superseded {
					read++
				}
			}
			if name != "no rows" {
				require.NotZero(t, read, "the chunk has rows to read")
			}
		})
	}
}

func everyNth(prefixes []netip.Prefix, n int) []netip.Prefix {
	var out []netip.Prefix
	for i := 0; i < len(prefixes); i += n {
		out = append(out, prefixes[i])
	}
	return out
}
