// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
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
