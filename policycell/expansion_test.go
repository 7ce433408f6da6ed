// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/policygen"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// fileIdentities returns one identity per distinct prefix of the
// policies, labelled with it: the identities the file alone puts into the
// ipcache.
func fileIdentities(policies []*policy.Policy) []*identitycell.Identity {
	var prefixes []netip.Prefix
	for _, p := range policies {
		prefixes = append(prefixes, p.Prefixes()...)
	}
	slices.SortFunc(prefixes, prefixkey.Compare)
	var out []*identitycell.Identity
	for i, prefix := range slices.Compact(prefixes) {
		out = append(out, identityRow(identity.MinLocal+identity.Number(i), labels.CIDRLabel(prefix)))
	}
	return out
}

// TestCountEntriesMatchesSelectors: for random policies (CIDRs inside one
// another, excepts, all addresses, rules for every peer, denies over
// allows, port ranges, ICMP), the count is the number of entries the
// selectors compute for the file's own identities (bruteForce, the
// reference of the selector engine's tests).
func TestCountEntriesMatchesSelectors(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 9))
	universe := []netip.Prefix{}
	for _, s := range []string{"0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.1.0/24", "10.1.1.1/32",
		"10.2.0.0/16", "192.0.2.0/24", "192.0.2.128/25", "::/0", "2001:db8::/32", "2001:db8:1::/48"} {
		universe = append(universe, netip.MustParsePrefix(s))
	}
	randomRule := func() policy.Rule {
		var rule policy.Rule
		for range rng.IntN(3) {
			peer := policy.CIDRSelector{CIDR: universe[rng.IntN(len(universe))]}
			for _, e := range universe {
				if e != peer.CIDR && prefixkey.Inside(peer.CIDR, e) && rng.IntN(4) == 0 {
					peer.Except = append(peer.Except, e)
				}
			}
			rule.Peers = append(rule.Peers, peer)
		}
		rule.Deny = rng.IntN(4) == 0
		rule.AnyPeer = rng.IntN(6) == 0
		switch rng.IntN(5) {
		case 0:
			rule.Ports = []policy.PortRange{{Port: uint16(53 + rng.IntN(2)), Protocol: policy.ProtocolUDP}, {Port: 443, Protocol: policy.ProtocolTCP}}
		case 1:
			rule.Ports = []policy.PortRange{{Port: uint16(400 + rng.IntN(60)), EndPort: uint16(460 + rng.IntN(600)), Protocol: policy.ProtocolTCP}}
		case 2:
			rule.Ports = []policy.PortRange{{Protocol: policy.ProtocolTCP}, {Port: 8, Protocol: policy.ProtocolICMP}}
		case 3:
			rule.Ports = []policy.PortRange{{Port: 1, EndPort: 65535, Protocol: policy.ProtocolUDP}}
		}
		return rule
	}
	for round := range 500 {
		var policies []*policy.Policy
		for i := range 1 + rng.IntN(3) {
			p := &policy.Policy{Name: fmt.Sprintf("p%d", i)}
			for range rng.IntN(4) {
				p.Ingress = append(p.Ingress, randomRule())
			}
			for range rng.IntN(4) {
				p.Egress = append(p.Egress, randomRule())
			}
			policies = append(policies, p)
		}
		want := len(bruteForce(policies, fileIdentities(policies)))
		got, err := CountEntries("f.yaml", policies, 1<<20)
		require.NoError(t, err)
		require.Equal(t, EntryCount{Entries: want, Exact: true}, got, "round %d", round)

		// One fewer than the count is over the limit; the count is the same,
		// or stops past the limit (an identity with more keys than it).
		if want > 1 {
			over, err := CountEntries("f.yaml", policies, want-1)
			require.ErrorIs(t, err, ErrTooManyEntries, "round %d", round)
			require.ErrorIs(t, err, policyfile.ErrInvalidPolicy)
			if over.Exact {
				require.Equal(t, got, over, "round %d", round)
			} else {
				require.Equal(t, want, over.Entries, "round %d: stops one past the limit", round)
			}
		}
	}
}

// TestCountEntriesCIDRsTimesPorts is the file that, expanded whole, took
// the agent's memory far over its bound (docs/FAULTS.md): 1,000 /24s times
// 40 port ranges, 18 KB, which compute 872,000 entries into a
// policy map of 16,384. It is rejected at
// its rule, with the count and the limit; at a limit it fits, it is
// valid.
func TestCountEntriesCIDRsTimesPorts(t *testing.T) {
	content := policygen.CIDRsTimesPorts("big", 1000, 40)
	policies, err := policyfile.Parse("big.yaml", content)
	require.NoError(t, err)
	// Each identity's keys: TCP and UDP, each range's aligned blocks.
	perIdentity := 0
	for _, pr := range policies[0].Egress[0].Ports {
		perIdentity += len(pr.AppendKeys(nil, policy.Key{}))
	}
	want := 1000 * perIdentity
	require.Greater(t, want, 800_000)

	count, err := CountEntries("big.yaml", policies, DefaultPolicyMapMaxEntries)
	require.Equal(t, EntryCount{Entries: want, Exact: true}, count)
	require.ErrorIs(t, err, ErrTooManyEntries)
	var fileErr *policyfile.FileError
	require.ErrorAs(t, err, &fileErr)
	require.Equal(t, 3, fileErr.Line)
	require.Equal(t, 5, fileErr.Column)
	require.Equal(t, fmt.Sprintf(`big.yaml:3:5: invalid policy file: policy "big": egress[0]: the file's policies compute %d policy map entries `+
		`(each CIDR's identity times the port blocks of the rules that select it), more than the policy map holds (16384, --policy-map-max-entries) `+
		`from this rule on: write fewer CIDRs or port ranges, or raise --policy-map-max-entries`, want), err.Error())

	count, err = CountEntries("big.yaml", policies, want)
	require.NoError(t, err)
	require.Equal(t, EntryCount{Entries: want, Exact: true}, count)

	// Far over the limit, the count stops, and says so.
	count, err = CountEntries("big.yaml", policies, 1000)
	require.ErrorIs(t, err, ErrTooManyEntries)
	require.Equal(t, EntryCount{Entries: countBeyond*1000 + 1}, count)
	require.Contains(t, err.Error(), fmt.Sprintf("compute more than %d policy map entries", countBeyond*1000+1))

	// One identity with more keys than the map: the count stops there.
	one := policygen.CIDRsTimesPorts("one", 1, 40)
	policies, err = policyfile.Parse("one.yaml", one)
	require.NoError(t, err)
	count, err = CountEntries("one.yaml", policies, 100)
	require.ErrorIs(t, err, ErrTooManyEntries)
	require.Equal(t, EntryCount{Entries: 101}, count)
}

// TestCountEntriesMemoryBounded: reading and counting the file of 872,000
// entries allocates, garbage included, a small fraction of what expanding
// it would: its keys alone are 16 bytes each (14 MB), the grants the
// selector engine expands them into 48 bytes each. The counter keeps one
// identity's keys at a time.
func TestCountEntriesMemoryBounded(t *testing.T) {
	content := policygen.CIDRsTimesPorts("big", 1000, 40)
	const bound = 4 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	policies, err := policyfile.Parse("big.yaml", content)
	require.NoError(t, err)
	count, err := CountEntries("big.yaml", policies, DefaultPolicyMapMaxEntries)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrTooManyEntries)
	require.Greater(t, count.Entries*16, bound, "a full expansion's keys alone would be over the bound")
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("file %d bytes, %d entries: allocated %d bytes", len(content), count.Entries, allocated)
	require.Less(t, allocated, uint64(bound), "the count allocated %d bytes", allocated)
}

// TestCountEntriesDenyHidesAllows: the allows inside a deny are not
// entries, however many; so a file of many allowed ports under a denied
// range fits.
func TestCountEntriesDenyHidesAllows(t *testing.T) {
	content := []byte("name: d\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 1, endPort: 65535, protocol: TCP}]\n" +
		"egressDeny:\n  - toCIDR: [10.0.0.0/8]\n    toPorts: [{port: 1, endPort: 65535, protocol: TCP}]\n")
	policies, err := policyfile.Parse("d.yaml", content)
	require.NoError(t, err)
	count, err := CountEntries("d.yaml", policies, 16)
	require.NoError(t, err)
	require.Equal(t, EntryCount{Entries: 16, Exact: true}, count, "the 16 deny blocks, no allow")
	require.Len(t, bruteForce(policies, fileIdentities(policies)), 16)
	_, err = CountEntries("d.yaml", policies, 15)
	require.True(t, errors.Is(err, ErrTooManyEntries))
}
