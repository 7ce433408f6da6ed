// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

func allow(k policy.Key, rule string) grant { return grant{k, policy.VerdictAllow, "a", "a:" + rule} }
func deny(k policy.Key, rule string) grant  { return grant{k, policy.VerdictDeny, "d", "d:" + rule} }

// TestResolveDenyWins: a deny wins over an allow of the same key or
// inside its prefix (whatever the allow's specificity); an allow wider
// than a deny stays, for the lookup to find the narrower deny.
func TestResolveDenyWins(t *testing.T) {
	l3 := policy.Key{Identity: 9, Direction: policy.Egress}
	tcp := policy.Key{Identity: 9, Direction: policy.Egress, Protocol: policy.ProtocolTCP, PortWildcardBits: 16}
	tcp443 := policy.Key{Identity: 9, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443}
	block := policy.Key{Identity: 9, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 440, PortWildcardBits: 3}
	udp53 := policy.Key{Identity: 9, Direction: policy.Egress, Protocol: policy.ProtocolUDP, Port: 53}
	ingress443 := tcp443
	ingress443.Direction = policy.Ingress
	type row struct {
		key     policy.Key
		verdict policy.Verdict
		rules   []string
	}
	rows := func(grants ...grant) []row {
		var out []row
		for _, e := range resolve(slices.Clone(grants), nil) {
			out = append(out, row{e.Key, e.Verdict, e.Rules})
		}
		// The names shared among a round's entries are the same.
		var shared []row
		for _, e := range resolve(grants, entryNames{}) {
			shared = append(shared, row{e.Key, e.Verdict, e.Rules})
		}
		require.Equal(t, out, shared)
		return out
	}
	// L3 deny vs port allow (deny broader): the allow goes.
	require.Equal(t, []row{{l3, policy.VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(tcp443, "egress[0]"), deny(l3, "egressDeny[0]")))
	// Port deny vs L3 allow (deny narrower): both stay.
	require.Equal(t, []row{{l3, policy.VerdictAllow, []string{"a:egress[0]"}}, {tcp443, policy.VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(l3, "egress[0]"), deny(tcp443, "egressDeny[0]")))
	// Same key: deny, of the deny rules alone.
	require.Equal(t, []row{{tcp443, policy.VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(tcp443, "egress[0]"), deny(tcp443, "egressDeny[0]")))
	// A block deny covers a port allow inside it, not one of another
	// protocol or direction; a protocol-wide deny covers the block.
	require.Equal(t, []row{
		{ingress443, policy.VerdictAllow, []string{"a:ingress[0]"}},
		{block, policy.VerdictDeny, []string{"d:egressDeny[0]"}},
		{udp53, policy.VerdictAllow, []string{"a:egress[1]"}},
	}, rows(allow(tcp443, "egress[0]"), allow(udp53, "egress[1]"), allow(ingress443, "ingress[0]"), deny(block, "egressDeny[0]")))
	require.Equal(t, []row{{tcp, policy.VerdictDeny, []string{"d:egressDeny[0]"}}},
		rows(allow(block, "egress[0]"), deny(tcp, "egressDeny[0]")))
	// Allows of one key from two rules: one entry naming both.
	require.Equal(t, []row{{tcp443, policy.VerdictAllow, []string{"a:egress[0]", "a:egress[1]"}}},
		rows(allow(tcp443, "egress[1]"), allow(tcp443, "egress[0]"), allow(tcp443, "egress[0]")))
}

// TestResolveDNSProxy: a dns-proxy wins over an allow of the same key (of
// the dns-proxy rules alone), a deny over a dns-proxy of the same key or
// inside its prefix; a dns-proxy narrower than an allow stays beside it.
func TestResolveDNSProxy(t *testing.T) {
	udp := policy.Key{Identity: 9, Direction: policy.Egress, Protocol: policy.ProtocolUDP, PortWildcardBits: 16}
	udp53 := policy.Key{Identity: 9, Direction: policy.Egress, Protocol: policy.ProtocolUDP, Port: 53}
	proxy := func(k policy.Key, rule string) grant { return grant{k, policy.VerdictDNSProxy, "p", "p:" + rule} }
	verdicts := func(grants ...grant) map[policy.Key]string {
		out := map[policy.Key]string{}
		for _, e := range resolve(grants, nil) {
			out[e.Key] = e.Verdict.String() + " " + e.Rules[0]
		}
		return out
	}
	require.Equal(t, map[policy.Key]string{udp53: "dns-proxy p:egress[0]"},
		verdicts(allow(udp53, "egress[0]"), proxy(udp53, "egress[0]")))
	require.Equal(t, map[policy.Key]string{udp53: "deny d:egressDeny[0]"},
		verdicts(allow(udp53, "egress[0]"), proxy(udp53, "egress[0]"), deny(udp53, "egressDeny[0]")))
	require.Equal(t, map[policy.Key]string{udp: "deny d:egressDeny[0]"},
		verdicts(proxy(udp53, "egress[0]"), deny(udp, "egressDeny[0]")))
	require.Equal(t, map[policy.Key]string{udp: "allow a:egress[0]", udp53: "dns-proxy p:egress[0]"},
		verdicts(allow(udp, "egress[0]"), proxy(udp53, "egress[0]")))
}
