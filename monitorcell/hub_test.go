// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"encoding/json"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// fakeSource is a program's event output: a ring no program writes to,
// and the mask the hub sets. The datapath's tests check the program
// writes what the mask asks for.
type fakeSource struct {
	ring *ebpf.Map // nil: no program loaded

	mu   sync.Mutex
	mask events.Kinds
}

func (f *fakeSource) Ring() (*ebpf.Map, error) {
	if f.ring == nil {
		return nil, events.ErrNoProgram
	}
	return f.ring, nil
}

func (f *fakeSource) SetMask(k events.Kinds) error {
	if f.ring == nil {
		return events.ErrNoProgram
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mask = k
	return nil
}

func (f *fakeSource) Lost() (uint64, uint64, error) {
	if f.ring == nil {
		return 0, 0, events.ErrNoProgram
	}
	return 0, 0, nil
}

func (f *fakeSource) currentMask() events.Kinds {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mask
}

// Without a loaded program there is nothing to subscribe to.
func TestSubscribeWithoutProgram(t *testing.T) {
	h := newHub(&fakeSource{})
	_, _, err := h.Subscribe(events.Drops)
	require.ErrorIs(t, err, events.ErrNoProgram)
}

// The mask is what the subscribers want together, 0 once the last one
// leaves; an event goes to the subscribers of its kind; a subscriber that
// falls behind loses events, counted; nothing is read after the stop.
func TestPrivilegedHubSubscribers(t *testing.T) {
	privileged.Test(t)
	ring, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 4096})
	require.NoError(t, err)
	t.Cleanup(func() { ring.Close() })
	source := &fakeSource{ring: ring}
	h := newHub(source)

	require.Zero(t, source.currentMask())
	verdicts, cancelVerdicts, err := h.Subscribe(events.Verdicts)
	require.NoError(t, err)
	drops, cancel, err := h.Subscribe(events.Drops)
	require.NoError(t, err)
	require.Equal(t, events.Drops|events.Verdicts, source.currentMask())

	drop := events.Event{Direction: policy.Ingress, Reason: bpfmaps.ReasonNoPolicy}
	h.dispatch(drop)
	select {
	case e := <-drops:
		require.Equal(t, drop, e)
	case <-time.After(5 * time.Second):
		t.Fatal("no drop event")
	}
	select {
	case e := <-verdicts:
		t.Fatalf("a drop went to a verdict subscriber: %+v", e)
	case <-time.After(50 * time.Millisecond):
	}
	require.Zero(t, cancelVerdicts())
	require.Equal(t, events.Drops, source.currentMask())

	// The drops subscriber reads nothing: one event past its buffer is lost.
	for range subscriberBuffer + 1 {
		h.dispatch(drop)
	}
	require.Equal(t, uint64(1), cancel())
	require.Zero(t, source.currentMask(), "the last subscriber gone, the program writes nothing")
	h.mu.Lock()
	require.Nil(t, h.reader, "the last subscriber gone, the ring is not read")
	h.mu.Unlock()

	_, cancel, err = h.Subscribe(events.Drops)
	require.NoError(t, err)
	h.stop()
	require.Zero(t, cancel(), "the stop dropped the subscriber")
	_, _, err = h.Subscribe(events.Drops)
	require.ErrorIs(t, err, events.ErrNoProgram)
}

func TestEventText(t *testing.T) {
	p := monitorParams{}
	e := events.Event{
		Time: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC), Ifindex: 1, Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy,
		Identity: 2, Protocol: 1, ICMPType: 8, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("192.0.2.1"),
	}
	var sb strings.Builder
	writeEventText(&sb, p.describe(e, map[uint32]string{1: "veth0"}))
	require.Equal(t, "2026-12-04T12:00:00Z drop (no-policy) on veth0 egress, identity 2 (reserved:world): 10.0.0.1 -> 192.0.2.1 ICMP type 8\n", sb.String())

	e = events.Event{Time: e.Time, Ifindex: 1, Direction: policy.Ingress, Allowed: true, Reason: bpfmaps.ReasonReply, Identity: 16777217,
		Protocol: 6, Src: e.Dst, Dst: e.Src, SrcPort: 443, DstPort: 40000}
	sb.Reset()
	writeEventText(&sb, p.describe(e, map[uint32]string{1: "veth0"}))
	require.Equal(t, "2026-12-04T12:00:00Z verdict allow (reply) on veth0 ingress, identity 16777217 (): 192.0.2.1:443 -> 10.0.0.1:40000 TCP\n", sb.String())
}

// An event of an endpoint's subject is named by the packet's local
// address (the source on egress, the destination on ingress), in the text
// and in the JSON; an address of another identity (the endpoint was
// relabelled since), another node's endpoint or the default's traffic
// keep the number alone.
func TestEventEndpointName(t *testing.T) {
	db := statedb.New()
	endpoints, err := endpoint.NewTable(db)
	require.NoError(t, err)
	txn := db.WriteTxn(endpoints)
	for _, s := range []*endpoint.State{
		{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "web-1", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}, Identity: 300, Local: true},
		{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "web-2", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")}}, Identity: 300, Local: true},
		{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "remote", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.3")}, Node: "b"}, Identity: 300},
	} {
		_, _, err := endpoints.Insert(txn, s)
		require.NoError(t, err)
	}
	txn.Commit()
	p := monitorParams{DB: db, Endpoints: endpoints}
	web1, web2, remote := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	peer := netip.MustParseAddr("192.0.2.1")
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

	egress := events.Event{Time: at, Ifindex: 1, Direction: policy.Egress, Reason: bpfmaps.ReasonNoPolicy,
		Identity: 2, Endpoint: 300, Protocol: 1, ICMPType: 8, Src: web2, Dst: peer}
	j := p.describe(egress, map[uint32]string{1: "veth0"})
	require.Equal(t, "shop/web-2", j.EndpointName)
	var sb strings.Builder
	writeEventText(&sb, j)
	require.Equal(t, "2026-12-04T12:00:00Z drop (no-policy) on veth0 egress, endpoint shop/web-2 (identity 300), identity 2 (reserved:world): 10.0.0.2 -> 192.0.2.1 ICMP type 8\n", sb.String())
	b, err := json.Marshal(j)
	require.NoError(t, err)
	require.Contains(t, string(b), `"endpoint":300,"endpointName":"shop/web-2",`)

	ingress := events.Event{Time: at, Ifindex: 1, Direction: policy.Ingress, Allowed: true, Reason: bpfmaps.ReasonReply,
		Identity: 2, Endpoint: 300, Protocol: 6, Src: peer, Dst: web1, SrcPort: 443, DstPort: 40000}
	require.Equal(t, "shop/web-1", p.describe(ingress, map[uint32]string{}).EndpointName, "ingress: the destination is the endpoint's")

	relabelled := egress
	relabelled.Endpoint = 301
	sb.Reset()
	j = p.describe(relabelled, map[uint32]string{1: "veth0"})
	require.Empty(t, j.EndpointName)
	writeEventText(&sb, j)
	require.Contains(t, sb.String(), "on veth0 egress, endpoint 301, identity 2")

	other := egress
	other.Src = remote
	require.Empty(t, p.describe(other, map[uint32]string{}).EndpointName, "another node's endpoint is not local")

	host := egress
	host.Endpoint, host.Src = 0, web1
	j = p.describe(host, map[uint32]string{})
	require.Empty(t, j.EndpointName, "the default's traffic names no endpoint")
	b, err = json.Marshal(j)
	require.NoError(t, err)
	require.NotContains(t, string(b), `"endpoint`)
}

// The protocol names are policy.Protocol's, but a malformed packet's 0 is
// "0", as before, not "any".
func TestProtocolName(t *testing.T) {
	for p, name := range map[uint8]string{0: "0", 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP", 47: "47"} {
		require.Equal(t, name, policy.Protocol(p).PacketString())
	}
}

// The entry that decided an event is the one of the event's subject (the
// local endpoint's identity), not the host-wide default's: its policies
// and rules are in the JSON and named in the text. The JSON's field names
// are the contract's (docs/CONTRACT.md "Monitor events").
func TestEventDecidingRuleAndJSONFields(t *testing.T) {
	db := statedb.New()
	entries, err := policy.NewEntryTable(db)
	require.NoError(t, err)
	identities, err := identitycell.NewIdentitiesTable(db)
	require.NoError(t, err)
	endpoints, err := endpoint.NewTable(db)
	require.NoError(t, err)
	web, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.0.2.10")
	txn := db.WriteTxn(entries, identities, endpoints)
	for _, e := range []*policy.Entry{
		// web's deny of 443 to identity 400, and the default's allow of
		// it, which must not be named for web's drop.
		{Key: policy.Key{Subject: 300, Identity: 400, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443},
			Verdict: policy.VerdictDeny, Policies: []string{"shop/deny-https"}, Rules: []string{"shop/deny-https:egressDeny[0]"}},
		{Key: policy.Key{Identity: 400, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443},
			Verdict: policy.VerdictAllow, Policies: []string{"host"}, Rules: []string{"host:egress[0]"}},
		// web's allow of any port to 400, by two rules.
		{Key: policy.Key{Subject: 300, Identity: 400, Direction: policy.Egress},
			Verdict: policy.VerdictAllow, Policies: []string{"shop/web"}, Rules: []string{"shop/web:egress[0]", "shop/web:egress[2]"}},
	} {
		_, _, err := entries.Insert(txn, e)
		require.NoError(t, err)
	}
	lbls, err := labels.New("cidr:192.0.2.0/24")
	require.NoError(t, err)
	_, _, err = identities.Insert(txn, &identitycell.Identity{ID: 400, Labels: lbls})
	require.NoError(t, err)
	_, _, err = endpoints.Insert(txn, &endpoint.State{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "web-1", Addresses: []netip.Addr{web}}, Identity: 300, Local: true})
	require.NoError(t, err)
	txn.Commit()
	p := monitorParams{DB: db, PolicyEntries: entries, Identities: identities, Endpoints: endpoints}
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	devices := map[uint32]string{1: "veth0"}

	deny := events.Event{Time: at, Ifindex: 1, Direction: policy.Egress, Reason: bpfmaps.ReasonPolicyDeny, Identity: 400, Endpoint: 300,
		Protocol: 6, Src: web, Dst: peer, SrcPort: 40000, DstPort: 443}
	var sb strings.Builder
	writeEventText(&sb, p.describe(deny, devices))
	require.Equal(t, "2026-12-04T12:00:00Z drop (policy-deny) on veth0 egress, endpoint shop/web-1 (identity 300), identity 400 (cidr:192.0.2.0/24): "+
		"10.0.0.1:40000 -> 192.0.2.10:443 TCP; policy shop/deny-https, rule shop/deny-https:egressDeny[0]\n", sb.String())

	allow := deny
	allow.Allowed, allow.Reason, allow.DstPort = true, bpfmaps.ReasonPolicy, 80
	sb.Reset()
	writeEventText(&sb, p.describe(allow, devices))
	require.True(t, strings.HasSuffix(sb.String(), "TCP; policy shop/web, rules shop/web:egress[0],shop/web:egress[2]\n"), sb.String())

	b, err := json.Marshal(p.describe(allow, devices))
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(b, &fields))
	require.Equal(t, map[string]any{
		"time": "2026-12-04T12:00:00Z", "device": "veth0", "direction": "egress", "src": "10.0.0.1", "dst": "192.0.2.10",
		"protocol": "TCP", "sport": float64(40000), "dport": float64(80), "identity": float64(400), "endpoint": float64(300),
		"endpointName": "shop/web-1", "labels": []any{"cidr:192.0.2.0/24"}, "verdict": "allow", "reason": "policy",
		"policy": "shop/web", "rules": []any{"shop/web:egress[0]", "shop/web:egress[2]"},
	}, fields)

	// A reply names no rule (no entry decided it); an ICMP has its type,
	// no ports; a reserved identity's label is its entity's.
	reply := events.Event{Time: at, Ifindex: 1, Direction: policy.Ingress, Allowed: true, Reason: bpfmaps.ReasonReply, Identity: identity.Host,
		Protocol: 1, ICMPType: 0, Src: peer, Dst: web}
	b, err = json.Marshal(p.describe(reply, devices))
	require.NoError(t, err)
	fields = nil
	require.NoError(t, json.Unmarshal(b, &fields))
	require.Equal(t, map[string]any{
		"time": "2026-12-04T12:00:00Z", "device": "veth0", "direction": "ingress", "src": "192.0.2.10", "dst": "10.0.0.1",
		"protocol": "ICMP", "type": float64(0), "identity": float64(1), "labels": []any{"reserved:host"}, "verdict": "allow", "reason": "reply",
	}, fields)
}
