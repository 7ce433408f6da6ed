// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/policygen"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The shape of BenchmarkPeerRelabel at scale 1: peerNamespaces
// namespaces, each with peerApps x peerTiers label sets (app, tier, and a
// team per two apps; every endpoint also has version=v1), half of them
// with one endpoint and half with peerCrowd, and policygen.PeerPoliciesPerNS
// policies choosing their peers among policygen.PeerSelectorsPerNS distinct peer
// selectors of their namespace. Scale k has k times the namespaces, so
// k times everything, while what one change in the first namespace
// selects stays the same.
const (
	peerNamespaces = 4
	peerApps       = policygen.PeerApps
	peerTiers      = policygen.PeerTiers
	peerCrowd      = 9
)

// peerShape is the label identities and local endpoints of one scale.
type peerShape struct {
	identities []*identitycell.Identity
	endpoints  []*endpoint.State
}

// peerLabelSets is the number of label sets per namespace.
const peerLabelSets = peerApps * peerTiers

// peerLabelSetsOf returns the identities and endpoints of scale k: label
// set s of namespace n is identity MinCluster + n*peerLabelSets + s, with
// app a-<s/peerTiers> and tier t-<s%peerTiers>; the even label sets have
// one endpoint (those a relabel moves: their identity goes with it), the
// odd ones peerCrowd.
func peerLabelSetsOf(tb testing.TB, k int) peerShape {
	var shape peerShape
	addr := 0
	for n := range k * peerNamespaces {
		ns := fmt.Sprintf("ns-%d", n)
		for s := range peerLabelSets {
			id := identity.MinCluster + identity.Number(n*peerLabelSets+s)
			count := 1
			if s%2 == 1 {
				count = peerCrowd
			}
			for i := range count {
				ep := peerEndpoint(tb, ns, fmt.Sprintf("ep-%d-%d", s, i), s, "v1", id, addr)
				addr++
				if i == 0 {
					shape.identities = append(shape.identities, identitycell.NewIdentity(id, ep.IdentityLabels, uint32(count), false))
				}
				shape.endpoints = append(shape.endpoints, ep)
			}
		}
	}
	return shape
}

// peerEndpoint is the row of local endpoint name of label set s of
// namespace ns, with version and identity id.
func peerEndpoint(tb testing.TB, ns, name string, s int, version string, id identity.Number, addr int) *endpoint.State {
	tb.Helper()
	app := s / peerTiers
	ep := endpoint.Endpoint{Namespace: ns, Name: name, Labels: map[string]string{
		"app": fmt.Sprintf("a-%d", app), "tier": fmt.Sprintf("t-%d", s%peerTiers),
		"team": fmt.Sprintf("team-%d", app/2), "version": version,
	}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{172, 16 + byte(addr>>16), byte(addr >> 8), byte(addr)})}}
	lbls, err := ep.IdentityLabels(nil)
	require.NoError(tb, err)
	return &endpoint.State{Endpoint: ep, Identity: id, IdentityLabels: lbls, Local: true}
}

// BenchmarkPeerRelabel measures the selector engine (bare tables, no
// kernel) with peers by label: at scale 1, 200 label sets (identities
// 256..455 in 4 namespaces), 1,000 local endpoints over them (half the
// label sets have one endpoint, half 9), and 500 policies, each applying
// to the label sets of one app of its namespace and allowing in from one
// and out to another of its namespace's 25 distinct peer selectors (100
// in all). scale=2 and scale=4 have 2 and 4 times the namespaces, so 2
// and 4 times all of it.
//
// One op relabels one endpoint of the first namespace (its version label
// v1 <-> v2), as the endpoint cell does: its new label identity's row and
// its endpoint row in one transaction, its old identity's row deleted in
// the next (it had no other endpoint), then a selector round. The round
// writes the new identity's entries as a peer in every subject that
// selects it and as a subject (with its policies' peers), and deletes the
// old one's. The relabel changes nothing a selector selects, so every
// scale's op has the same entries to write: its cost should not grow with
// the scale.
//
// Reported per op: cpu-ns (the process's CPU time, getrusage), visited (peer groups and selectors matched),
// recomputed (identities whose entries were recomputed), and entries
// (the new identity's rows as a peer, the same at every scale). Memory,
// from the setup: heap-B/labelset is the heap in use after GC with the
// label sets' identity and endpoint rows and no policy, less that of the
// empty tables, per label set; heap-B/policy, with the policies and the
// entries they give, less that without, per policy; entries/policy the
// `policy` table's rows per policy.
func BenchmarkPeerRelabel(b *testing.B) {
	// Memory is measured once per scale, here: the sub-benchmarks run
	// more than once, and the fixtures of earlier runs are alive until
	// their cleanup at the end.
	type heap struct{ perLabelSet, perPolicy float64 }
	memory := map[int]heap{}
	for _, k := range []int{1, 2, 4} {
		empty := peerLiveHeap()
		f, shape, policies := newPeerFixture(b, k)
		withPolicies := peerLiveHeap()
		txn := f.db.WriteTxn(f.policies)
		for _, p := range policies {
			_, _, err := f.policies.Delete(txn, p)
			require.NoError(b, err)
		}
		txn.Commit()
		f.round(b)
		require.Zero(b, f.entries.NumObjects(f.db.ReadTxn()))
		withLabelSets := peerLiveHeap()
		memory[k] = heap{
			perLabelSet: (float64(withLabelSets) - float64(empty)) / float64(len(shape.identities)),
			perPolicy:   (float64(withPolicies) - float64(withLabelSets)) / float64(len(policies)),
		}
	}
	for _, k := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("scale=%d", k), func(b *testing.B) {
			f, shape, policies := newPeerFixture(b, k)
			entries := f.entries.NumObjects(f.db.ReadTxn())
			require.NotZero(b, entries)

			// The relabelled endpoint: label set 0 of ns-0, alone in it.
			versions := [2]*endpoint.State{
				shape.endpoints[0],
				peerEndpoint(b, "ns-0", shape.endpoints[0].Name, 0, "v2", identity.MaxCluster, 0),
			}
			rows := [2]*identitycell.Identity{
				shape.identities[0],
				identitycell.NewIdentity(identity.MaxCluster, versions[1].IdentityLabels, 1, false),
			}
			var visited, recomputed, peerEntries int
			var cpu time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				from, to := i%2, (i+1)%2
				before, beforeRecomputed := f.engine.visited, f.engine.recomputed
				cpuBefore := peerCPUTime(b)
				txn := f.db.WriteTxn(f.identities, f.endpoints)
				_, _, err := f.identities.Insert(txn, rows[to])
				require.NoError(b, err)
				_, _, err = f.endpoints.Insert(txn, versions[to])
				require.NoError(b, err)
				txn.Commit()
				f.deleteIdentity(b, rows[from])
				f.round(b)
				visited += f.engine.visited - before
				recomputed += f.engine.recomputed - beforeRecomputed

				b.StopTimer()
				cpu += peerCPUTime(b) - cpuBefore
				n := 0
				for range policy.IdentityEntries(f.db.ReadTxn(), f.entries, rows[to].ID) {
					n++
				}
				require.NotZero(b, n, "the new identity's entries")
				peerEntries += n
				b.StartTimer()
			}
			b.StopTimer()
			require.Equal(b, entries, f.entries.NumObjects(f.db.ReadTxn()), "a relabel changes no selection")
			b.ReportMetric(float64(visited)/float64(b.N), "visited/op")
			b.ReportMetric(float64(recomputed)/float64(b.N), "recomputed/op")
			b.ReportMetric(float64(peerEntries)/float64(b.N), "entries/op")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(memory[k].perLabelSet, "heap-B/labelset")
			b.ReportMetric(memory[k].perPolicy, "heap-B/policy")
			b.ReportMetric(float64(entries)/float64(len(policies)), "entries/policy")
		})
	}
}

// newPeerFixture returns an engine on bare tables with the label sets,
// endpoints and policies of scale k, computed.
func newPeerFixture(b *testing.B, k int) (*engineFixture, peerShape, []*policy.Policy) {
	f := newEngineFixture(b).withEndpoints()
	f.engine.log = slog.New(slog.DiscardHandler)
	// The bound of the policy map's size is not what is measured.
	f.engine.maxEntries = 1 << 30
	f.policiesRead()
	f.ipcacheResolved()
	shape := peerLabelSetsOf(b, k)
	f.upsertIdentities(b, shape.identities...)
	f.upsertEndpoints(b, shape.endpoints...)
	f.round(b)
	policies := policygen.PeerPolicies(k * peerNamespaces)
	f.upsertPolicies(b, policies...)
	f.round(b)
	return f, shape, policies
}

// peerCPUTime is the process's user and system CPU time so far: on a
// shared machine, less affected by other load than the time per op.
func peerCPUTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	require.NoError(b, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peerLiveHeap returns the bytes of live heap objects after garbage
// collection.
func peerLiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
