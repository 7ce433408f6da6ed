// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortRangeKeys: a range is the fewest aligned blocks that cover
// exactly its ports (every port in one block, none outside); port 0 alone
// or to 65535 is the whole protocol, as Cilium's; ICMP types are the high
// byte.
func TestPortRangeKeys(t *testing.T) {
	keys := func(pr PortRange) []Key { return pr.AppendKeys(nil, Key{Identity: 7, Direction: Egress}) }
	for _, pr := range []PortRange{
		{Protocol: ProtocolTCP, Port: 8000, EndPort: 8100}, {Protocol: ProtocolUDP, Port: 1, EndPort: 65535},
		{Protocol: ProtocolTCP, Port: 30000, EndPort: 32767}, {Protocol: ProtocolSCTP, Port: 65534, EndPort: 65535},
		{Protocol: ProtocolTCP, Port: 16, EndPort: 31}, {Protocol: ProtocolTCP, Port: 443},
		{Protocol: ProtocolTCP, Port: 0, EndPort: 1000}, {Protocol: ProtocolUDP, Port: 0, EndPort: 1},
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
	require.Equal(t, []Key{{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, Port: 16, PortWildcardBits: 4}},
		keys(PortRange{Protocol: ProtocolTCP, Port: 16, EndPort: 31}), "one block when the range is one")
	require.Len(t, keys(PortRange{Protocol: ProtocolUDP, Port: 1, EndPort: 65535}), 16, "1-65535: 1, 2-3, ..., 32768-65535")
	require.Len(t, keys(PortRange{Protocol: ProtocolTCP, Port: 8000, EndPort: 8100}), 4, "8000-8063, 8064-8095, 8096-8099, 8100")
	require.Equal(t, []Key{{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 10}},
		keys(PortRange{Protocol: ProtocolTCP, EndPort: 1023}), "0-1023: one block, not every port")
	require.Equal(t, "0-1023/TCP", PortRange{Protocol: ProtocolTCP, EndPort: 1023}.String())
	require.Equal(t, "any/TCP", PortRange{Protocol: ProtocolTCP, EndPort: 65535}.String())
	whole := []Key{{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}}
	require.Equal(t, whole, keys(PortRange{Protocol: ProtocolTCP}))
	require.Equal(t, whole, keys(PortRange{Protocol: ProtocolTCP, EndPort: 65535}))
	require.Equal(t, []Key{{Identity: 7, Direction: Egress, Protocol: ProtocolICMPv6, Port: 128 << 8, PortWildcardBits: 8}},
		keys(PortRange{Protocol: ProtocolICMPv6, Port: 128}))
}

// TestResolvePolicy: the program's two lookups: a deny of either
// identity wins, else an allow of either, else none.
func TestResolvePolicy(t *testing.T) {
	table := map[Key]Verdict{}
	lookup := func(k Key) (Key, Verdict, bool, error) {
		e, found := LookupEntries(k, func(k Key) (*Entry, bool) {
			v, found := table[k]
			return &Entry{Key: k, Verdict: v}, found
		})
		if !found {
			return Key{}, 0, false, nil
		}
		return e.Key, e.Verdict, true, nil
	}
	pkt := Lookup{Identity: 9, Direction: Egress, Protocol: ProtocolTCP, Port: 443, HasPort: true}
	decided := func() Match {
		r, err := Resolve(pkt, lookup)
		require.NoError(t, err)
		return r.Decided
	}
	require.False(t, decided().Found)
	table[Key{Identity: 0, Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}] = VerdictAllow
	require.Equal(t, Key{Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}, decided().Matched)
	table[Key{Identity: 9, Direction: Egress}] = VerdictAllow
	require.Equal(t, Key{Identity: 9, Direction: Egress}, decided().Matched, "the remote identity's allow first")
	table[Key{Identity: 0, Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}] = VerdictDeny
	table[Key{Identity: 0, Direction: Egress, Protocol: ProtocolTCP, Port: 440, PortWildcardBits: 3}] = VerdictDeny
	require.Equal(t, VerdictDeny, decided().Verdict, "identity 0's deny wins over the remote identity's allow")
	pkt.HasPort = false // a later fragment: the protocol-wide deny only
	d := decided()
	require.Equal(t, Key{Direction: Egress, Protocol: ProtocolTCP, PortWildcardBits: 16}, d.Matched)
	pkt.Protocol = ProtocolUDP
	require.Equal(t, VerdictAllow, decided().Verdict)
}

// TestResolveDNSProxy: a dns-proxy entry allows; it wins over an allow
// of the other lookup, and a deny of either wins over it.
func TestResolveDNSProxy(t *testing.T) {
	table := map[Key]Verdict{}
	lookup := func(k Key) (Key, Verdict, bool, error) {
		e, found := LookupEntries(k, func(k Key) (*Entry, bool) {
			v, found := table[k]
			return &Entry{Key: k, Verdict: v}, found
		})
		if !found {
			return Key{}, 0, false, nil
		}
		return e.Key, e.Verdict, true, nil
	}
	pkt := Lookup{Identity: 9, Direction: Egress, Protocol: ProtocolUDP, Port: 53, HasPort: true}
	decided := func() Match {
		r, err := Resolve(pkt, lookup)
		require.NoError(t, err)
		return r.Decided
	}
	dns := Key{Identity: 0, Direction: Egress, Protocol: ProtocolUDP, Port: 53}
	table[dns] = VerdictDNSProxy
	require.True(t, decided().Found)
	require.Equal(t, VerdictDNSProxy, decided().Verdict)
	require.True(t, decided().Verdict.Allows())
	table[Key{Identity: 9, Direction: Egress}] = VerdictAllow
	require.Equal(t, dns, decided().Matched, "identity 0's dns-proxy wins over the remote identity's allow")
	table[Key{Identity: 9, Direction: Egress, Protocol: ProtocolUDP, PortWildcardBits: 16}] = VerdictDeny
	require.Equal(t, VerdictDeny, decided().Verdict, "a deny wins over a dns-proxy")
	require.False(t, VerdictDeny.Allows())
}

// TestPolicyKeyStringRoundTrip: db/get takes the keys as the table shows
// them.
func TestPolicyKeyStringRoundTrip(t *testing.T) {
	for _, k := range []Key{
		{Identity: 7, Direction: Egress},
		{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, Port: 443},
		{Identity: 0, Direction: Ingress, Protocol: ProtocolTCP, Port: 8064, PortWildcardBits: 5},
		{Identity: 7, Direction: Egress, Protocol: ProtocolUDP, PortWildcardBits: 16},
		{Identity: 7, Direction: Egress, Protocol: ProtocolICMPv6, Port: 128 << 8, PortWildcardBits: 8},
		{Identity: 7, Direction: Egress, Protocol: ProtocolTCP, Port: 32768, PortWildcardBits: 15},
	} {
		got, err := keyFromString(k.String())
		require.NoError(t, err, k.String())
		require.Equal(t, k.indexKey(), got, k.String())
	}
	for _, bad := range []string{"7/egress/TCP/8001-8064", "7/egress/TCP/10-9", "7/egress/TCP/type=8", "7/egress/ICMP/type=256", "7/egress/TCP/x"} {
		_, err := keyFromString(bad)
		require.Error(t, err, bad)
	}
}
