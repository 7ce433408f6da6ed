// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

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
