// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// fixture is the identity cell and the ipcache's parts, with the resolver
// driven by the test (round) instead of by its job.
type fixture struct {
	db         *statedb.DB
	allocator  *identitycell.Allocator
	identities statedb.Table[*identitycell.Identity]
	metadata   statedb.RWTable[*PrefixMetadata]
	entries    statedb.RWTable[*Entry]
	ipcache    *IPCache
	resolver   *resolver
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	var f fixture
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(cell.NewSimpleHealth),
		cell.Config(statedir.DefaultConfig),
		identitycell.Cell,
		cell.Invoke(func(db *statedb.DB, a *identitycell.Allocator, ids statedb.Table[*identitycell.Identity]) (err error) {
			f.db, f.allocator, f.identities = db, a, ids
			if f.metadata, err = NewMetadataTable(db); err != nil {
				return err
			}
			f.entries, err = NewEntriesTable(db)
			return err
		}),
	)
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
	log := hivetest.Logger(tb)
	require.NoError(tb, h.Start(log, context.Background()))
	tb.Cleanup(func() { require.NoError(tb, h.Stop(log, context.Background())) })
	resolved := progress.New[statedb.Revision](0)
	f.resolver = newResolver(f.db, f.metadata, f.entries, f.allocator, log, resolved)
	f.ipcache = newIPCache(f.db, f.metadata, f.resolver)
	return &f
}

func (f *fixture) round(tb testing.TB) {
	tb.Helper()
	_, err := f.resolver.round()
	require.NoError(tb, err)
}

// TestRandomOwnershipKeepsReferencesExact has many handles upsert, remove
// and release metadata on overlapping prefixes at random, while other code
// holds references of its own. After every step the `ipcache` table must
// be what the owners said, and each identity's reference count must equal
// the entries resolved to it plus the references held elsewhere. When every
// handle and outside reference is gone, nothing is left.
//
// Checked after every step, each change is resolved in a round of its own;
// in the second run, rounds come every few steps and every prefix is a
// chunk, so that a prefix queued by several changes is taken once per
// change, the earlier ones superseded by the later.
func TestRandomOwnershipKeepsReferencesExact(t *testing.T) {
	t.Run("every step", func(t *testing.T) { testRandomOwnership(t, 1, maxResolveChunkSize) })
	t.Run("chunks of one, rounds every few steps", func(t *testing.T) { testRandomOwnership(t, 4, 1) })
}

func testRandomOwnership(t *testing.T, stepsPerRound, chunkSize int) {
	f := newFixture(t)
	f.resolver.chunkSize, f.resolver.maxChunkSize = chunkSize, chunkSize
	rng := rand.New(rand.NewPCG(1, 2))

	prefixes := []netip.Prefix{}
	for _, s := range []string{"0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.1.0/24", "10.1.1.1/32",
		"192.0.2.0/24", "::/0", "2001:db8::/32", "2001:db8:1::/48", "2001:db8:1::1/128"} {
		prefixes = append(prefixes, netip.MustParsePrefix(s))
	}
	// Each resource has its own source, so precedence decides every merge.
	resources := map[string]source.Source{
		"agent": source.Local, "pods": source.Kubernetes, "policy/a": source.Directory,
		"policy/b": source.API, "generated": source.Generated, "restore": source.Restored,
	}
	resourceNames := slices.Sorted(func(yield func(string) bool) {
		for name := range resources {
			if !yield(name) {
				return
			}
		}
	})
	extraLabels := []string{"app:a", "app:b", "team:x"}

	handles := map[string]*Handle{}
	said := map[string]map[netip.Prefix]Metadata{} // what each resource said
	heldElsewhere := map[identity.Number]uint32{}

	randomMetadata := func() Metadata {
		var md Metadata
		var ls []string
		for _, l := range extraLabels {
			if rng.IntN(3) == 0 {
				ls = append(ls, l)
			}
		}
		md.Labels, _ = labels.New(ls...)
		if rng.IntN(3) == 0 {
			md.RequestedIdentity = identity.MinLocal + identity.Number(rng.IntN(20))
		}
		if rng.IntN(8) == 0 {
			md.ExplicitIdentity = identity.Number(5000 + rng.IntN(3))
		}
		return md
	}

	for step := range 3000 {
		resource := resourceNames[rng.IntN(len(resourceNames))]
		prefix := prefixes[rng.IntN(len(prefixes))]
		h := handles[resource]
		if h == nil {
			var err error
			h, err = f.ipcache.NewHandle(resource, resources[resource])
			require.NoError(t, err)
			handles[resource] = h
			said[resource] = map[netip.Prefix]Metadata{}
		}
		switch op := rng.IntN(10); {
		case op < 5:
			md := randomMetadata()
			require.NoError(t, h.Upsert(prefix, md))
			said[resource][prefix] = md
		case op < 7:
			require.NoError(t, h.Remove(prefix))
			delete(said[resource], prefix)
		case op < 8:
			require.NoError(t, h.Release())
			delete(handles, resource)
			delete(said, resource)
		case op < 9:
			lbls := labels.ForPrefix(prefix)
			if rng.IntN(2) == 0 {
				lbls = lbls.Union(randomMetadata().Labels)
			}
			txn := f.allocator.WriteTxn()
			id, err := f.allocator.AllocateTxn(txn, lbls, 0)
			require.NoError(t, err)
			txn.Commit()
			heldElsewhere[id]++
		default:
			for id := range heldElsewhere {
				txn := f.allocator.WriteTxn()
				_, err := f.allocator.ReleaseTxn(txn, id)
				require.NoError(t, err)
				txn.Commit()
				if heldElsewhere[id]--; heldElsewhere[id] == 0 {
					delete(heldElsewhere, id)
				}
				break
			}
		}
		if rng.IntN(stepsPerRound) == 0 {
			f.round(t)
			f.checkAgainst(t, step, said, resources, heldElsewhere)
		}
	}
	f.round(t)
	f.checkAgainst(t, -1, said, resources, heldElsewhere)

	for _, h := range handles {
		require.NoError(t, h.Release())
	}
	for id, n := range heldElsewhere {
		for range n {
			txn := f.allocator.WriteTxn()
			_, err := f.allocator.ReleaseTxn(txn, id)
			require.NoError(t, err)
			txn.Commit()
		}
	}
	f.round(t)
	txn := f.db.ReadTxn()
	require.Zero(t, f.entries.NumObjects(txn), "entries left")
	require.Zero(t, f.identities.NumObjects(txn), "identities left")
	require.Zero(t, f.metadata.NumObjects(txn), "metadata left")
}

// checkAgainst compares the tables with what the owners said.
func (f *fixture) checkAgainst(t *testing.T, step int, said map[string]map[netip.Prefix]Metadata,
	sources map[string]source.Source, heldElsewhere map[identity.Number]uint32) {
	t.Helper()
	type want struct {
		labels         labels.Labels
		source         source.Source
		explicit       identity.Number
		explicitSource source.Source
	}
	wants := map[netip.Prefix]*want{}
	for resource, prefixes := range said {
		src := sources[resource]
		for prefix, md := range prefixes {
			w := wants[prefix]
			if w == nil {
				w = &want{labels: labels.ForPrefix(prefix), source: src}
				wants[prefix] = w
			}
			w.labels = w.labels.Union(md.Labels)
			if src.Overrides(w.source) {
				w.source = src
			}
			if md.ExplicitIdentity != 0 && (w.explicit == 0 || src.Overrides(w.explicitSource)) {
				w.explicit, w.explicitSource = md.ExplicitIdentity, src
			}
		}
	}

	txn := f.db.ReadTxn()
	references := map[identity.Number]uint32{}
	for id, n := range heldElsewhere {
		references[id] += n
	}
	entries := 0
	for entry := range f.entries.All(txn) {
		entries++
		w, ok := wants[entry.Prefix()]
		require.True(t, ok, "step %d: entry %s that nobody owns", step, entry.Prefix())
		require.Equal(t, w.source, entry.Source, "step %d: source of %s", step, entry.Prefix())
		if w.explicit != 0 {
			require.True(t, entry.Explicit, "step %d: %s", step, entry.Prefix())
			require.Equal(t, w.explicit, entry.Identity, "step %d: %s", step, entry.Prefix())
			continue
		}
		require.False(t, entry.Explicit, "step %d: %s", step, entry.Prefix())
		ident, _, found := f.identities.Get(txn, identitycell.IdentityIndex.Query(entry.Identity))
		require.True(t, found, "step %d: %s maps to unallocated identity %d", step, entry.Prefix(), entry.Identity)
		require.Equal(t, w.labels, ident.Labels, "step %d: labels of %s's identity", step, entry.Prefix())
		references[entry.Identity]++
	}
	require.Equal(t, len(wants), entries, "step %d: every owned prefix has an entry", step)

	actual := map[identity.Number]uint32{}
	for ident := range f.identities.All(txn) {
		actual[ident.ID] = ident.References()
	}
	require.Equal(t, references, actual, "step %d: reference counts", step)
}
