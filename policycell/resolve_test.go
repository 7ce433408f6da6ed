// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortRangeKeys: a range is the fewest aligned blocks that cover
// exactly its ports (every port in one block, none outside); port 0 alone
// or to 65535 is the whole protocol, as Cilium's; ICMP types are the high
// byte.
func TestPortRangeKeys(t *testing.T) {
	keys := func(pr PortRange) []PolicyKey { return pr.appendKeys(nil, PolicyKey{Identity: 7, Direction: Egress}) }
	for _, pr := range []PortRange{
		{Protocol: ProtocolTCP, Port: 8000, EndPort: 8100}, {Protocol: ProtocolUDP, Port: 1, EndPort: 65535},
		{Protocol: ProtocolTCP, Port: 30000, EndPort: 32767}, {Protocol: ProtocolSCTP, Port: 65534, EndPort: 65535},
		{Protocol: ProtocolTCP, Port: 16, EndPort: 31}, {Protocol: ProtocolTCP, Port: 443},
	} {
		ks := keys(pr)
		covered := map[uint32]int{}
		for _, k := range ks {
			require.Equal(t, pr.Protocol, k.Protocol)
			require.Zero(t, uint32(k.Port)&(1<<k.PortWildcardBits-1), "aligned: %v", k)
			for p := uint32(k.Port); p <= uint32(k.Port)|(1<<k.PortWildcardBits-1); p++ {
				covered[p]++
			}
		}
		end := uint32(max(pr.EndPort, pr.Port))
		for p := range uint32(65536) {
			want := 0
			if p >= uint32(pr.Port) && p <= end {
				want = 1
			}
			require.Equal(t, want, covered[p], "%s: port %d", pr, p)
		}
	}
	require.Equal(t, []PolicyKey{{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, Port: 16, PortWildcardBits: 4}},
		keys(PortRange{Protocol: ProtocolTCP, Port: 16, EndPort: 31}), "one block when the range is one")
	require.Len(t, keys(PortRange{Protocol: ProtocolUDP, Port: 1, EndPort: 65535}), 16, "1-65535: 1, 2-3, ..., 32768-65535")
	require.Len(t, keys(PortRange{Protocol: ProtocolTCP, Port: 8000, EndPort: 8100}), 4, "8000-8063, 8064-8095, 8096-8099, 8100")
	whole := []PolicyKey{{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}}
	require.Equal(t, whole, keys(PortRange{Protocol: ProtocolTCP}))
	require.Equal(t, whole, keys(PortRange{Protocol: ProtocolTCP, EndPort: 65535}))
	require.Equal(t, []PolicyKey{{Identity: 7, Direction: Egress, Protocol: ProtocolICMPv6, Port: 128 << 8, PortWildcardBits: 8}},
		keys(PortRange{Protocol: ProtocolICMPv6, Port: 128}))
	require.Equal(t, uint32(56), keys(PortRange{Protocol: ProtocolICMP, Port: 8})[0].MapPrefixLen())
}

func allow(k PolicyKey, rule string) grant { return grant{k, VerdictAllow, "a", "a:" + rule} }
func deny(k PolicyKey, rule string) grant  { return grant{k, VerdictDeny, "d", "d:" + rule} }

// TestResolveDenyWins: a deny wins over an allow of the same key or
// inside its prefix (whatever the allow's specificity); an allow wider
// than a deny stays, for the lookup to find the narrower deny.
func TestResolveDenyWins(t *testing.T) {
	l3 := PolicyKey{Identity: 9, Direction: Egress}
	tcp := PolicyKey{Identity: 9, Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}
	tcp443 := PolicyKey{Identity: 9, Direction: Egress, Protocol: ProtocolTCP, Port: 443}
	block := PolicyKey{Identity: 9, Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}
	udp53 := PolicyKey{Identity: 9, Direction: Egress, Protocol: ProtocolUDP, Port: 53}
	ingress443 := tcp443
	ingress443.Direction = Ingress
	type row struct {
		key     PolicyKey
		verdict Verdict
		rules   []string
	}
	rows := func(grants ...grant) []row {
		var out []row
		for _, e := range resolve(grants) {
			out = append(out, row{e.Key, e.Verdict, e.Rules})
		}
		return out
	}
	// L3 deny vs port allow (deny broader): the allow goes.
	require.Equal(t, []row{{l3, VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(tcp443, "egress[0]"), deny(l3, "egressDeny[0]")))
	// Port deny vs L3 allow (deny narrower): both stay.
	require.Equal(t, []row{{l3, VerdictAllow, []string{"a:egress[0]"}}, {tcp443, VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(l3, "egress[0]"), deny(tcp443, "egressDeny[0]")))
	// Same key: deny, of the deny rules alone.
	require.Equal(t, []row{{tcp443, VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(tcp443, "egress[0]"), deny(tcp443, "egressDeny[0]")))
	// A block deny covers a port allow inside it, not one of another
	// protocol or direction; a protocol-wide deny covers the block.
	require.Equal(t, []row{
		{ingress443, VerdictAllow, []string{"a:ingress[0]"}},
		{block, VerdictDeny, []string{"d:egressDeny[0]"}},
		{udp53, VerdictAllow, []string{"a:egress[1]"}},
	}, rows(allow(tcp443, "egress[0]"), allow(udp53, "egress[1]"), allow(ingress443, "ingress[0]"), deny(block, "egressDeny[0]")))
	require.Equal(t, []row{{tcp, VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(block, "egress[0]"), deny(tcp, "egressDeny[0]")))
	// Allows of one key from two rules: one entry naming both.
	require.Equal(t, []row{{tcp443, VerdictAllow, []string{"a:egress[0]", "a:egress[1]"}}},
		rows(allow(tcp443, "egress[1]"), allow(tcp443, "egress[0]"), allow(tcp443, "egress[0]")))
}

// TestResolvePolicy: the program's two lookups: a deny of either
// identity wins, else an allow of either, else none.
func TestResolvePolicy(t *testing.T) {
	table := map[PolicyKey]Verdict{}
	lookup := func(k PolicyKey) (PolicyKey, Verdict, bool, error) {
		e, found := lookupEntries(k, func(k PolicyKey) (*PolicyEntry, bool) {
			v, found := table[k]
			return &PolicyEntry{Key: k, Verdict: v}, found
		})
		if !found {
			return PolicyKey{}, 0, false, nil
		}
		return e.Key, e.Verdict, true, nil
	}
	pkt := PolicyLookup{Identity: 9, Direction: Egress, Protocol: ProtocolTCP, Port: 443, HasPort: true}
	decided := func() PolicyMatch {
		r, err := ResolvePolicy(pkt, lookup)
		require.NoError(t, err)
		return r.Decided
	}
	require.False(t, decided().Found)
	table[PolicyKey{Identity: 0, Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}] = VerdictAllow
	require.Equal(t, PolicyKey{Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}, decided().Matched)
	table[PolicyKey{Identity: 9, Direction: Egress}] = VerdictAllow
	require.Equal(t, PolicyKey{Identity: 9, Direction: Egress}, decided().Matched, "the remote identity's allow first")
	table[PolicyKey{Identity: 0, Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}] = VerdictDeny
	table[PolicyKey{Identity: 0, Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}] = VerdictDeny
	require.Equal(t, VerdictDeny, decided().Verdict, "identity 0's deny wins over the remote identity's allow")
	pkt.HasPort = false // a later fragment: the protocol-wide deny only
	d := decided()
	require.Equal(t, PolicyKey{Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}, d.Matched)
	pkt.Protocol = ProtocolUDP
	require.Equal(t, VerdictAllow, decided().Verdict)
}

// TestPolicyKeyStringRoundTrip: db/get takes the keys as the table shows
// them.
func TestPolicyKeyStringRoundTrip(t *testing.T) {
	for _, k := range []PolicyKey{
		{Identity: 7, Direction: Egress},
		{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, Port: 443},
		{Identity: 0, Direction: Ingress, Protocol: ProtocolTCP, Port: 8064, PortWildcardBits: 5},
		{Identity: 7, Direction: Egress, Protocol: ProtocolUDP, PortWildcardBits: 16},
		{Identity: 7, Direction: Egress, Protocol: ProtocolICMPv6, Port: 128 << 8, PortWildcardBits: 8},
		{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, Port: 32768, PortWildcardBits: 15},
	} {
		got, err := policyKeyFromString(k.String())
		require.NoError(t, err, k.String())
		require.Equal(t, k.key(), got, k.String())
	}
	for _, bad := range []string{"7/egress/TCP/8001-8064", "7/egress/TCP/10-9", "7/egress/TCP/type=8", "7/egress/ICMP/type=256", "7/egress/TCP/x"} {
		_, err := policyKeyFromString(bad)
		require.Error(t, err, bad)
	}
}
