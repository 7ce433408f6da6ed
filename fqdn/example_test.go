// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// Example is the flow the DNS proxy's owner follows: read a response,
// learn its addresses, ask which addresses a selector selects, and let
// the cache expire them, kept while a connection uses them.
func Example() {
	sel := fqdn.Selector{MatchPattern: "*.example.com"}
	matcher, err := sel.Compile()
	if err != nil {
		panic(err)
	}

	msg := new(dns.Msg)
	msg.SetQuestion("www.example.com.", dns.TypeA)
	msg.Answer = []dns.RR{
		&dns.CNAME{Hdr: dns.RR_Header{Name: "www.example.com.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 300}, Target: "edge.cdn.net."},
		&dns.A{Hdr: dns.RR_Header{Name: "edge.cdn.net.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP("192.0.2.10")},
	}
	answer := fqdn.ReadAnswer(msg, "www.example.com.", fqdn.Limits{})

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cache := fqdn.NewCache(fqdn.Config{MinTTL: time.Minute}, func() time.Time { return now })
	update := cache.Add(answer)
	fmt.Println("label:", sel.Label())
	fmt.Println("added:", update.Added[0].Name, update.Added[0].Addr, update.Added[0].Expires.Format(time.RFC3339))
	fmt.Println("selected:", cache.Addresses(matcher))

	now = now.Add(2 * time.Minute)
	connected := func(a netip.Addr) bool { return a == netip.MustParseAddr("192.0.2.10") }
	fmt.Println("removed while connected:", len(cache.GC(connected)))
	removed := cache.GC(nil)
	fmt.Println("removed once closed:", removed[0].Addr, "last:", removed[0].Last)
	// Output:
	// label: fqdn:*.example.com
	// added: www.example.com 192.0.2.10 2026-01-01T00:01:00Z
	// selected: [192.0.2.10]
	// removed while connected: 0
	// removed once closed: 192.0.2.10 last: true
}
