// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"net/netip"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// fakeSides names identities and endpoints as the tables would.
type fakeSides struct {
	labels    map[identity.Number][]string
	endpoints map[netip.Addr]string // by the packet's local address
}

func (f fakeSides) identityLabels(n identity.Number) []string { return f.labels[n] }

func (f fakeSides) endpointName(e events.Event) string {
	if e.Direction == policy.Egress {
		return f.endpoints[e.Src]
	}
	return f.endpoints[e.Dst]
}

func parseFilter(t *testing.T, args ...string) (*Filter, error) {
	t.Helper()
	fs := pflag.NewFlagSet("monitor", pflag.ContinueOnError)
	AddFilterFlags(fs)
	require.NoError(t, fs.Parse(args))
	return ParseFilter(fs)
}

func TestFilterMatch(t *testing.T) {
	web, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.0.2.10")
	web6, peer6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("2001:db8::10")
	names := fakeSides{
		labels: map[identity.Number][]string{
			300: {"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"},
			2:   {"reserved:world"},
			400: {"cidr:192.0.2.0/24"},
		},
		endpoints: map[netip.Addr]string{web: "shop/web-1", web6: "shop/web-1"},
	}
	// web-1 (identity 300) to 192.0.2.10:443 over TCP, dropped by a deny.
	egressTCP := events.Event{Direction: policy.Egress, Reason: bpfmaps.ReasonPolicyDeny, Identity: 400, Endpoint: 300,
		Protocol: 6, Src: web, Dst: peer, SrcPort: 40000, DstPort: 443}
	// 192.0.2.10 to web-1's UDP 53, allowed by policy.
	ingressUDP := events.Event{Direction: policy.Ingress, Allowed: true, Reason: bpfmaps.ReasonPolicy, Identity: 400,
		Endpoint: 300, Protocol: 17, Src: peer, Dst: web, SrcPort: 5353, DstPort: 53}
	// The host-wide default's ping to the world over IPv6, no policy.
	icmp6 := events.Event{Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy, Identity: 2,
		Protocol: 58, ICMPType: 128, Src: web6, Dst: peer6}
	// web-1's own ping over IPv6, from its address.
	epICMP6 := icmp6
	epICMP6.Endpoint = 300
	malformed := events.Event{Direction: policy.Ingress, Reason: bpfmaps.ReasonMalformed}

	all := map[string]events.Event{"egressTCP": egressTCP, "ingressUDP": ingressUDP, "icmp6": icmp6, "epICMP6": epICMP6, "malformed": malformed}
	for _, tc := range []struct {
		name string
		args []string
		want []string // the events of all that pass
	}{
		{"none", nil, []string{"egressTCP", "ingressUDP", "icmp6", "epICMP6", "malformed"}},
		{"from-ip address", []string{"--from-ip", "10.0.0.1"}, []string{"egressTCP"}},
		{"from-ip CIDR", []string{"--from-ip", "192.0.2.0/24"}, []string{"ingressUDP"}},
		{"to-ip CIDR, host bits set", []string{"--to-ip", "192.0.2.77/24"}, []string{"egressTCP"}},
		{"to-ip address is not its CIDR", []string{"--to-ip", "192.0.2.1"}, nil},
		{"ip either side", []string{"--ip", "10.0.0.1"}, []string{"egressTCP", "ingressUDP"}},
		{"ip IPv6 CIDR", []string{"--ip", "2001:db8::/32"}, []string{"icmp6", "epICMP6"}},
		{"to-ip IPv6 address", []string{"--to-ip", "2001:db8::10"}, []string{"icmp6", "epICMP6"}},
		{"IPv4 CIDR does not match IPv6", []string{"--ip", "0.0.0.0/0"}, []string{"egressTCP", "ingressUDP"}},
		{"ip OR within the flag", []string{"--ip", "10.0.0.1", "--ip", "fd00::1"}, []string{"egressTCP", "ingressUDP", "icmp6", "epICMP6"}},
		{"ip comma-separated", []string{"--ip", "10.0.0.1,fd00::1"}, []string{"egressTCP", "ingressUDP", "icmp6", "epICMP6"}},
		{"from-ip AND to-ip", []string{"--from-ip", "10.0.0.0/8", "--to-ip", "192.0.2.10"}, []string{"egressTCP"}},
		{"from-ip AND to-ip, none both", []string{"--from-ip", "10.0.0.0/8", "--to-ip", "10.0.0.0/8"}, nil},
		{"port either side", []string{"--port", "53"}, []string{"ingressUDP"}},
		{"port source side", []string{"--port", "40000"}, []string{"egressTCP"}},
		{"from-port", []string{"--from-port", "443"}, nil},
		{"to-port", []string{"--to-port", "443"}, []string{"egressTCP"}},
		{"port 0 is no ICMP's", []string{"--port", "0"}, nil},
		{"protocol name", []string{"--protocol", "tcp"}, []string{"egressTCP"}},
		{"protocol names any case, OR", []string{"--protocol", "UDP", "--protocol", "icmpv6"}, []string{"ingressUDP", "icmp6", "epICMP6"}},
		{"protocol number", []string{"--protocol", "58"}, []string{"icmp6", "epICMP6"}},
		{"verdict drop", []string{"--verdict", "drop"}, []string{"egressTCP", "icmp6", "epICMP6", "malformed"}},
		{"verdict dropped", []string{"--verdict", "dropped"}, []string{"egressTCP", "icmp6", "epICMP6", "malformed"}},
		{"verdict allow", []string{"--verdict", "allow"}, []string{"ingressUDP"}},
		{"verdict reason", []string{"--verdict", "policy-deny"}, []string{"egressTCP"}},
		{"verdict reasons OR", []string{"--verdict", "no-policy,malformed-ip-header"}, []string{"icmp6", "epICMP6", "malformed"}},
		{"verdict allow reason", []string{"--verdict", "policy"}, []string{"ingressUDP"}},
		{"identity remote side", []string{"--identity", "400"}, []string{"egressTCP", "ingressUDP"}},
		{"identity local side", []string{"--identity", "300"}, []string{"egressTCP", "ingressUDP", "epICMP6"}},
		{"from-identity: egress's is the endpoint's", []string{"--from-identity", "300"}, []string{"egressTCP", "epICMP6"}},
		{"from-identity: ingress's is the remote's", []string{"--from-identity", "400"}, []string{"ingressUDP"}},
		{"to-identity", []string{"--to-identity", "2"}, []string{"icmp6", "epICMP6"}},
		{"label of the local side", []string{"--label", "k8s:app=web"}, []string{"egressTCP", "ingressUDP", "epICMP6"}},
		{"label of the remote side", []string{"--label", "reserved:world"}, []string{"icmp6", "epICMP6"}},
		{"labels OR", []string{"--label", "cidr:192.0.2.0/24", "--label", "reserved:world"}, []string{"egressTCP", "ingressUDP", "icmp6", "epICMP6"}},
		{"label nobody has", []string{"--label", "k8s:app=db"}, nil},
		{"endpoint", []string{"--endpoint", "shop/web-1"}, []string{"egressTCP", "ingressUDP", "epICMP6"}},
		{"endpoint, the default's traffic has none", []string{"--endpoint", "shop/web-1", "--ip", "2001:db8::10"}, []string{"epICMP6"}},
		{"endpoint nobody is", []string{"--endpoint", "shop/db"}, nil},
		{"every flag AND", []string{"--from-ip", "10.0.0.0/8", "--to-ip", "192.0.2.0/24", "--to-port", "443", "--protocol", "tcp",
			"--verdict", "drop", "--identity", "400", "--label", "k8s:app=web", "--endpoint", "shop/web-1"}, []string{"egressTCP"}},
		{"every flag AND, one misses", []string{"--from-ip", "10.0.0.0/8", "--to-ip", "192.0.2.0/24", "--to-port", "443", "--protocol", "tcp",
			"--verdict", "allow", "--identity", "400", "--label", "k8s:app=web", "--endpoint", "shop/web-1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseFilter(t, tc.args...)
			require.NoError(t, err)
			var got []string
			for _, name := range []string{"egressTCP", "ingressUDP", "icmp6", "epICMP6", "malformed"} {
				if f.match(all[name], names) {
					got = append(got, name)
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// Only --label and --endpoint look names up.
func TestFilterLooksUpOnlyWhatItNeeds(t *testing.T) {
	f, err := parseFilter(t, "--ip", "10.0.0.0/8")
	require.NoError(t, err)
	require.True(t, f.match(events.Event{Src: netip.MustParseAddr("10.0.0.1"), Endpoint: 300}, panicSides{}))
}

type panicSides struct{}

func (panicSides) identityLabels(identity.Number) []string { panic("labels looked up") }
func (panicSides) endpointName(events.Event) string        { panic("endpoint looked up") }

// Invalid values are errors naming the flag and the value.
func TestFilterInvalid(t *testing.T) {
	for _, args := range [][]string{
		{"--from-ip", "10.0.0.300"},
		{"--to-ip", "10.0.0.0/33"},
		{"--ip", "web"},
		{"--ip", "fe80::1%eth0"},
		{"--port", "65536"},
		{"--from-port", "-1"},
		{"--to-port", "http"},
		{"--protocol", "gre"},
		{"--protocol", "any"},
		{"--protocol", "256"},
		{"--verdict", "denied"},
		{"--verdict", "reason-9"},
		{"--identity", "0"},
		{"--from-identity", "-1"},
		{"--to-identity", "4294967296"},
		{"--label", "app=web"},
		{"--endpoint", "web-1"},
		{"--endpoint", "shop/web/1"},
	} {
		_, err := parseFilter(t, args...)
		require.ErrorIs(t, err, ErrFilter, "%v", args)
		require.ErrorContains(t, err, args[0]+` "`+args[1]+`"`)
	}
}

// Without --type, the verdicts asked for choose the events.
func TestFilterKinds(t *testing.T) {
	for args, want := range map[string]events.Kinds{
		"":                                     events.Drops,
		"--verdict=drop":                       events.Drops,
		"--verdict=reply":                      events.Verdicts,
		"--verdict=allow":                      events.Verdicts,
		"--verdict=no-policy,policy":           events.Drops | events.Verdicts,
		"--verdict=spoofed-source,policy-deny": events.Drops,
	} {
		var fargs []string
		if args != "" {
			fargs = []string{args}
		}
		f, err := parseFilter(t, fargs...)
		require.NoError(t, err)
		require.Equal(t, want, f.kinds(), args)
	}
}

// FilterArgs passes on exactly the values given, quoted for the shell.
func TestFilterArgs(t *testing.T) {
	fs := pflag.NewFlagSet("monitor", pflag.ContinueOnError)
	AddFilterFlags(fs)
	require.NoError(t, fs.Parse([]string{"--to-ip", "10.0.0.0/8,fd00::1", "--label", "k8s:it's=x", "--verdict", "drop"}))
	require.Equal(t, []string{"--to-ip='10.0.0.0/8'", "--to-ip='fd00::1'", "--verdict='drop'", "--label='k8s:it''s=x'"}, FilterArgs(fs))
}
