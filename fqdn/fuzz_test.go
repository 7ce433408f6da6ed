// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// FuzzAnswer reads any bytes the proxy could receive as a DNS response:
// unpacking fails or the answer is read within its limits, and learning
// it keeps the cache within its caps; nothing panics.
func FuzzAnswer(f *testing.F) {
	pack := func(qname string, answers ...dns.RR) []byte {
		msg := new(dns.Msg)
		msg.SetQuestion(qname, dns.TypeA)
		msg.Response = true
		msg.Answer = answers
		wire, err := msg.Pack()
		require.NoError(f, err)
		return wire
	}
	f.Add(pack("a.example.com.", rrA("a.example.com.", 60, "192.0.2.1"), rrAAAA("a.example.com.", 1<<31, "2001:db8::1")))
	f.Add(pack("www.example.com.", rrCNAME("www.example.com.", 300, "edge.cdn.net."), rrCNAME("edge.cdn.net.", 20, "www.example.com."), rrA("edge.cdn.net.", 5, "192.0.2.8")))
	f.Add(pack("x.", rrA("y.", 1, "192.0.2.1"), rrCNAME("x.", 1, "y.")))
	// A header with one question whose name is a compression pointer to
	// itself.
	f.Add([]byte{0, 1, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})
	// One answer whose owner name points at itself.
	f.Add([]byte{0, 1, 0x81, 0x80, 0, 0, 0, 1, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1})
	f.Add([]byte{})

	limits := fqdn.Limits{MaxRecords: 64, MaxChain: 4}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := new(dns.Msg)
		if err := msg.Unpack(data); err != nil {
			return
		}
		question := "."
		if len(msg.Question) > 0 {
			question = msg.Question[0].Name
		}
		answer := fqdn.ReadAnswer(msg, question, limits)
		if len(answer.Addresses) > limits.MaxRecords || len(answer.Names) > limits.MaxChain+1 {
			t.Fatalf("over the limits: %d addresses, %d names", len(answer.Addresses), len(answer.Names))
		}
		if len(answer.Names) == 0 || answer.Names[0] != answer.Question {
			t.Fatalf("names %q do not start with the question %q", answer.Names, answer.Question)
		}
		reached := make(map[string]bool)
		for _, name := range answer.Names {
			if reached[name] {
				t.Fatalf("name %q reached twice", name)
			}
			reached[name] = true
		}
		for _, a := range answer.Addresses {
			if !reached[a.Name] || !a.Addr.IsValid() || a.TTL > 1<<31-1 {
				t.Fatalf("address %+v: not of a name reached, invalid or TTL too large", a)
			}
		}
		if len(answer.Addresses)+answer.Skipped.Total() > len(msg.Answer)+2 { // +2: the chain's cut and loop
			t.Fatalf("%d addresses and %+v skipped of %d records", len(answer.Addresses), answer.Skipped, len(msg.Answer))
		}

		cache := fqdn.NewCache(fqdn.Config{MaxAddressesPerName: 3, MaxLive: 5, MaxDeferred: 2}, func() time.Time { return time.Unix(1e9, 0) })
		cache.Add(answer)
		cache.GC(nil)
		if s := cache.Stats(); s.Live > 5 || s.Deferred > 2 {
			t.Fatalf("cache over its caps: %+v", s)
		}
	})
}
