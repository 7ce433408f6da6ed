// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// dnsEvent is web-1's query for api.example.com, forwarded.
func dnsEvent() events.DNS {
	return events.DNS{
		Time:      time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC),
		Client:    netip.MustParseAddrPort("10.0.0.1:40000"),
		Server:    netip.MustParseAddrPort("192.0.2.53:53"),
		Endpoint:  300,
		Name:      "api.example.com",
		Type:      1,
		Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		Verdict:   events.DNSForwarded,
		Held:      2 * time.Millisecond,
	}
}

// DNS events need no program: a DNS subscriber gets them while the
// program's events cannot be subscribed to. One that falls behind loses
// events, counted; the publisher never waits. An answer's addresses are
// bounded.
func TestDNSWithoutProgram(t *testing.T) {
	h := newHub(&fakeSource{})
	h.PublishDNS(dnsEvent()) // nobody subscribed: dropped at once

	_, _, err := h.Subscribe(events.Drops)
	require.ErrorIs(t, err, events.ErrNoProgram)
	subscribed, cancel := h.SubscribeDNS()
	e := dnsEvent()
	h.PublishDNS(e)
	select {
	case got := <-subscribed:
		require.Equal(t, e, got)
	case <-time.After(5 * time.Second):
		t.Fatal("no DNS event")
	}
	require.Empty(t, subscribed, "the event published before the subscription is not handed out")

	many := dnsEvent()
	for i := range events.MaxDNSAddresses + 5 {
		many.Addresses = append(many.Addresses, netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}))
	}
	h.PublishDNS(many)
	got := <-subscribed
	require.Len(t, got.Addresses, events.MaxDNSAddresses)
	require.Equal(t, many.Addresses[:events.MaxDNSAddresses], got.Addresses)

	// The subscriber reads nothing: one event past its buffer is lost.
	for range subscriberBuffer + 1 {
		h.PublishDNS(e)
	}
	require.Equal(t, uint64(1), cancel())
	require.Zero(t, h.dnsCount.Load())
	h.PublishDNS(e) // after the last subscriber left: dropped at once
}

// A DNS event goes to the DNS subscribers only, a program's event to its
// kind's only; DNS subscribers never set a bit of the program's mask.
func TestPrivilegedHubDNSAndProgramSubscribers(t *testing.T) {
	privileged.Test(t)
	ring, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 4096})
	require.NoError(t, err)
	t.Cleanup(func() { ring.Close() })
	source := &fakeSource{ring: ring}
	h := newHub(source)

	dns, cancelDNS := h.SubscribeDNS()
	require.Zero(t, source.currentMask(), "a DNS subscriber asks the program for nothing")
	drops, cancelDrops, err := h.Subscribe(events.Drops | events.DNSQueries)
	require.NoError(t, err)
	require.Equal(t, events.Drops, source.currentMask(), "the DNS kind is no bit of the program's mask")

	h.PublishDNS(dnsEvent())
	select {
	case <-dns:
	case <-time.After(5 * time.Second):
		t.Fatal("no DNS event")
	}
	h.dispatch(events.Event{})
	select {
	case <-drops:
	case <-time.After(5 * time.Second):
		t.Fatal("no drop event")
	}
	select {
	case e := <-dns:
		t.Fatalf("a DNS subscriber got another event: %+v", e)
	case e := <-drops:
		t.Fatalf("a drop subscriber got another event: %+v", e)
	case <-time.After(50 * time.Millisecond):
	}
	require.Zero(t, cancelDrops())
	require.Zero(t, source.currentMask())
	require.Zero(t, cancelDNS())
}

// A DNS event's text and JSON: the client's endpoint named by its
// address as a packet's, the question's type and the response code by
// their names (RFC 3597's for unknown ones), the addresses, the verdict
// and the hold. The JSON's field names are the contract's
// (docs/CONTRACT.md "Monitor events").
func TestDNSTextAndJSON(t *testing.T) {
	db := statedb.New()
	endpoints, err := endpoint.NewTable(db)
	require.NoError(t, err)
	txn := db.WriteTxn(endpoints)
	_, _, err = endpoints.Insert(txn, &endpoint.State{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "web-1",
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}, Identity: 300, Local: true})
	require.NoError(t, err)
	txn.Commit()
	p := monitorParams{DB: db, Endpoints: endpoints}

	e := dnsEvent()
	e.Addresses = append(e.Addresses, netip.MustParseAddr("2001:db8::10"))
	var sb strings.Builder
	writeDNSText(&sb, p.describeDNS(e))
	require.Equal(t, "2026-12-04T12:00:00Z dns 10.0.0.1:40000 -> 192.0.2.53:53, endpoint shop/web-1 (identity 300): "+
		"api.example.com A NOERROR [192.0.2.10, 2001:db8::10] forwarded held 2ms\n", sb.String())
	b, err := json.Marshal(p.describeDNS(e))
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(b, &fields))
	require.Equal(t, map[string]any{
		"type": "dns", "time": "2026-12-04T12:00:00Z", "client": "10.0.0.1:40000", "server": "192.0.2.53:53",
		"endpoint": float64(300), "endpointName": "shop/web-1", "name": "api.example.com", "qtype": "A", "rcode": "NOERROR",
		"addresses": []any{"192.0.2.10", "2001:db8::10"}, "verdict": "forwarded", "held": "2ms",
	}, fields)

	// The host-wide default's refused query: no endpoint, no addresses;
	// an unknown type and code by number.
	refused := events.DNS{Time: e.Time, Client: netip.MustParseAddrPort("[fd00::1]:5353"), Server: netip.MustParseAddrPort("[2001:db8::53]:53"),
		Name: "evil.example", Type: 65000, Rcode: 5, Verdict: events.DNSRefused}
	sb.Reset()
	writeDNSText(&sb, p.describeDNS(refused))
	require.Equal(t, "2026-12-04T12:00:00Z dns [fd00::1]:5353 -> [2001:db8::53]:53: evil.example TYPE65000 REFUSED [] refused held 0s\n", sb.String())
	b, err = json.Marshal(p.describeDNS(refused))
	require.NoError(t, err)
	fields = nil
	require.NoError(t, json.Unmarshal(b, &fields))
	require.Equal(t, map[string]any{
		"type": "dns", "time": "2026-12-04T12:00:00Z", "client": "[fd00::1]:5353", "server": "[2001:db8::53]:53",
		"name": "evil.example", "qtype": "TYPE65000", "rcode": "REFUSED", "addresses": []any{}, "verdict": "refused", "held": "0s",
	}, fields)
	refused.Rcode = 4000
	require.Equal(t, "RCODE4000", p.describeDNS(refused).Rcode)
	mapped := e
	mapped.Client = netip.MustParseAddrPort("[::ffff:10.0.0.1]:40000")
	j := p.describeDNS(mapped)
	require.Equal(t, "10.0.0.1:40000", j.Client, "an IPv4-mapped client is shown as the IPv4 it is")
	require.Equal(t, "shop/web-1", j.EndpointName)

	// An endpoint's event from an address that is not its own now.
	other := e
	other.Endpoint = 301
	sb.Reset()
	writeDNSText(&sb, p.describeDNS(other))
	require.Contains(t, sb.String(), "192.0.2.53:53, endpoint 301: api.example.com")
}

// The filters on DNS events: the client is the source, the server the
// destination; drop is refused or failed, allow forwarded; label and
// endpoint are the client endpoint's; port, protocol and identity
// filters pass none.
func TestFilterMatchDNS(t *testing.T) {
	web := netip.MustParseAddr("10.0.0.1")
	names := fakeSides{
		labels:    map[identity.Number][]string{300: {"k8s:app=web"}},
		endpoints: map[netip.Addr]string{web: "shop/web-1"},
	}
	forwarded := dnsEvent()
	refused := dnsEvent()
	refused.Verdict, refused.Rcode, refused.Addresses = events.DNSRefused, 5, nil
	failed := dnsEvent()
	failed.Verdict, failed.Endpoint, failed.Client = events.DNSFailed, 0, netip.MustParseAddrPort("[::ffff:10.0.0.9]:4000")
	all := map[string]events.DNS{"forwarded": forwarded, "refused": refused, "failed": failed}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"none", nil, []string{"forwarded", "refused", "failed"}},
		{"from-ip is the client", []string{"--from-ip", "10.0.0.1"}, []string{"forwarded", "refused"}},
		{"from-ip, a mapped client is its IPv4", []string{"--from-ip", "10.0.0.9"}, []string{"failed"}},
		{"to-ip is the server", []string{"--to-ip", "192.0.2.0/24"}, []string{"forwarded", "refused", "failed"}},
		{"to-ip is not the client", []string{"--to-ip", "10.0.0.1"}, nil},
		{"ip either", []string{"--ip", "192.0.2.53"}, []string{"forwarded", "refused", "failed"}},
		{"verdict allow", []string{"--verdict", "allow"}, []string{"forwarded"}},
		{"verdict forwarded", []string{"--verdict", "forwarded"}, []string{"forwarded"}},
		{"verdict drop", []string{"--verdict", "drop"}, []string{"refused", "failed"}},
		{"verdict refused", []string{"--verdict", "refused"}, []string{"refused"}},
		{"verdict failed", []string{"--verdict", "failed"}, []string{"failed"}},
		{"verdict reason", []string{"--verdict", "no-policy"}, nil},
		{"label of the client", []string{"--label", "k8s:app=web"}, []string{"forwarded", "refused"}},
		{"endpoint", []string{"--endpoint", "shop/web-1"}, []string{"forwarded", "refused"}},
		{"endpoint AND verdict", []string{"--endpoint", "shop/web-1", "--verdict", "drop"}, []string{"refused"}},
		{"port", []string{"--port", "53"}, nil},
		{"protocol", []string{"--protocol", "udp"}, nil},
		{"identity", []string{"--identity", "300"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseFilter(t, tc.args...)
			require.NoError(t, err)
			var got []string
			for _, name := range []string{"forwarded", "refused", "failed"} {
				if f.matchDNS(all[name], names) {
					got = append(got, name)
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// DNS events' own verdicts pass no program event; alone, they ask for
// DNS events.
func TestFilterDNSVerdicts(t *testing.T) {
	f, err := parseFilter(t, "--verdict", "refused,failed")
	require.NoError(t, err)
	require.Equal(t, events.DNSQueries, f.kinds())
	require.False(t, f.match(events.Event{Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy}, fakeSides{}))
	require.False(t, f.match(events.Event{Direction: policy.Egress, Allowed: true, Reason: bpfmaps.ReasonPolicy}, fakeSides{}))
	f, err = parseFilter(t, "--verdict", "refused,drop")
	require.NoError(t, err)
	require.Equal(t, events.DNSQueries|events.Drops, f.kinds())
}

// --type's values.
func TestEventKinds(t *testing.T) {
	for typ, want := range map[string]events.Kinds{"drop": events.Drops, "verdict": events.Verdicts, "dns": events.DNSQueries,
		"all": events.Drops | events.Verdicts | events.DNSQueries} {
		got, err := EventKinds(typ)
		require.NoError(t, err)
		require.Equal(t, want, got, typ)
	}
	_, err := EventKinds("dropped")
	require.ErrorIs(t, err, ErrEventType)
}
