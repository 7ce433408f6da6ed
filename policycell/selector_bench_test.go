// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// BenchmarkIdentityAppears measures the cost of one identity appearing
// while n policies (of 10 CIDRs each, every CIDR with its identity and
// entry) are in force: the identities table gets a row for a /32 inside
// one policy's CIDR, and a selector round processes it and writes its one
// entry. Only that policy selects it, so the cost must not grow with n:
// compare the sub-benchmarks. The identity is removed again (and that
// round run) with the timer stopped.
func BenchmarkIdentityAppears(b *testing.B) {
	const cidrsPerPolicy = 10
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			f := newEngineFixture(b)
			f.engine.log = slog.New(slog.DiscardHandler)
			var (
				batch      []*policy.Policy
				identities []*identitycell.Identity
			)
			for i := range n {
				var cidrs []string
				for j := range cidrsPerPolicy {
					k := i*cidrsPerPolicy + j
					cidr := fmt.Sprintf("%d.%d.%d.0/24", 10+k>>16, k>>8&0xff, k&0xff)
					cidrs = append(cidrs, cidr)
					identities = append(identities, identityRow(identity.MinLocal+identity.Number(k),
						"cidr:"+cidr))
				}
				batch = append(batch, cidrPolicy(fmt.Sprintf("policy-%d", i), policy.Egress,
					[]policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}}, cidrs...))
			}
			f.upsertPolicies(b, batch...)
			f.upsertIdentities(b, identities...)
			f.policiesRead()
			f.ipcacheResolved()
			f.round(b)
			require.Equal(b, n*cidrsPerPolicy, f.entries.NumObjects(f.db.ReadTxn()))

			// A host inside the CIDR of the policy in the middle.
			host := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.7/32", (n/2*cidrsPerPolicy)>>8&0xff, (n/2*cidrsPerPolicy)&0xff))
			appearing := identityRow(identity.MaxLocal, "cidr:"+host.String())
			visited := 0
			b.ResetTimer()
			for range b.N {
				before := f.engine.visited
				f.upsertIdentities(b, appearing)
				f.round(b)
				visited += f.engine.visited - before

				b.StopTimer()
				f.deleteIdentity(b, appearing)
				f.round(b)
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(float64(visited)/float64(b.N), "selectors/op")
		})
	}
}

// BenchmarkEndpoints measures the selectors with 1,000 local endpoints of
// 100 label sets (identities), each label set selected by 10 policies of
// one CIDR (with its identity) and one port: 1,000 policies, one entry
// per policy and subject.
//   - all: the 1,000 endpoints appear at once and one round computes
//     their 1,000 entries and 200 enforcement rows (they go again with
//     the timer stopped).
//   - new-identity: the first endpoint of a label set appears and its
//     round writes its 10 entries and 2 rows; it goes again with the
//     timer stopped.
//   - same-identity: one more endpoint of a label set in force: nothing
//     to write.
//
// identities/op is how many remote identities a round recomputed.
func BenchmarkEndpoints(b *testing.B) {
	const (
		labelSets   = 100
		perLabelSet = 10
		endpoints   = 1_000
	)
	setup := func(b *testing.B) (*engineFixture, []*endpoint.State) {
		f := newEngineFixture(b).withEndpoints()
		f.engine.log = slog.New(slog.DiscardHandler)
		var (
			batch      []*policy.Policy
			identities []*identitycell.Identity
		)
		// One label set more than the endpoints have, for new-identity.
		for set := range labelSets + 1 {
			for j := range perLabelSet {
				k := set*perLabelSet + j
				cidr := fmt.Sprintf("10.%d.%d.0/24", k>>8&0xff, k&0xff)
				identities = append(identities, identityRow(identity.MinLocal+identity.Number(k), "cidr:"+cidr))
				batch = append(batch, selectingPolicy(fmt.Sprintf("policy-%d-%d", set, j), fmt.Sprintf("app-%d", set), cidr))
			}
		}
		f.upsertPolicies(b, batch...)
		f.upsertIdentities(b, identities...)
		f.policiesRead()
		f.ipcacheResolved()
		f.round(b)
		var eps []*endpoint.State
		for i := range endpoints {
			set := i % labelSets
			addr := netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)})
			eps = append(eps, localEndpoint(b, fmt.Sprintf("ep-%d", i), identity.MinCluster+identity.Number(set), addr,
				"app", fmt.Sprintf("app-%d", set)))
		}
		return f, eps
	}
	report := func(b *testing.B, f *engineFixture, recomputed int) {
		b.ReportMetric(float64(recomputed)/float64(b.N), "identities/op")
	}

	b.Run("all", func(b *testing.B) {
		f, eps := setup(b)
		recomputed := 0
		b.ResetTimer()
		for range b.N {
			before := f.engine.recomputed
			f.upsertEndpoints(b, eps...)
			f.round(b)
			recomputed += f.engine.recomputed - before

			b.StopTimer()
			require.Equal(b, labelSets*perLabelSet, f.entries.NumObjects(f.db.ReadTxn()))
			f.deleteEndpoints(b, eps...)
			f.round(b)
			b.StartTimer()
		}
		b.StopTimer()
		report(b, f, recomputed)
	})
	b.Run("new-identity", func(b *testing.B) {
		f, eps := setup(b)
		f.upsertEndpoints(b, eps...)
		f.round(b)
		appearing := localEndpoint(b, "new", identity.MinCluster+labelSets, netip.MustParseAddr("172.17.0.1"),
			"app", fmt.Sprintf("app-%d", labelSets))
		recomputed := 0
		b.ResetTimer()
		for range b.N {
			before := f.engine.recomputed
			f.upsertEndpoints(b, appearing)
			f.round(b)
			recomputed += f.engine.recomputed - before

			b.StopTimer()
			require.Equal(b, (labelSets+1)*perLabelSet, f.entries.NumObjects(f.db.ReadTxn()))
			f.deleteEndpoints(b, appearing)
			f.round(b)
			b.StartTimer()
		}
		b.StopTimer()
		report(b, f, recomputed)
	})
	b.Run("same-identity", func(b *testing.B) {
		f, eps := setup(b)
		f.upsertEndpoints(b, eps...)
		f.round(b)
		appearing := localEndpoint(b, "new", identity.MinCluster, netip.MustParseAddr("172.17.0.1"), "app", "app-0")
		recomputed := 0
		b.ResetTimer()
		for range b.N {
			before := f.engine.recomputed
			f.upsertEndpoints(b, appearing)
			f.round(b)
			recomputed += f.engine.recomputed - before

			b.StopTimer()
			f.deleteEndpoints(b, appearing)
			f.round(b)
			b.StartTimer()
		}
		b.StopTimer()
		report(b, f, recomputed)
	})
}
