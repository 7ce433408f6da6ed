// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

func rrA(name string, ttl uint32, addr string) dns.RR {
	return &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: net.ParseIP(addr)}
}

func rrAAAA(name string, ttl uint32, addr string) dns.RR {
	return &dns.AAAA{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: ttl}, AAAA: net.ParseIP(addr)}
}

func rrCNAME(name string, ttl uint32, target string) dns.RR {
	return &dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: target}
}

// response is a response to an A question for qname, through the wire
// and back, as the proxy would read it.
func response(t testing.TB, qname string, answers ...dns.RR) *dns.Msg {
	t.Helper()
	msg := new(dns.Msg)
	msg.SetQuestion(qname, dns.TypeA)
	msg.Response = true
	msg.Answer = answers
	wire, err := msg.Pack()
	require.NoError(t, err)
	out := new(dns.Msg)
	require.NoError(t, out.Unpack(wire))
	return out
}

func addr(name string, ttl uint32, a string) fqdn.Address {
	return fqdn.Address{Name: name, Addr: netip.MustParseAddr(a), TTL: ttl}
}

func TestReadAnswer(t *testing.T) {
	tests := []struct {
		name     string
		question string
		answers  []dns.RR
		limits   fqdn.Limits
		names    []string
		want     []fqdn.Address
		skipped  fqdn.Skipped
	}{
		{
			name:     "A and AAAA of the question, any case",
			question: "Api.Example.com.",
			answers:  []dns.RR{rrA("api.example.COM.", 60, "192.0.2.1"), rrAAAA("api.example.com.", 30, "2001:db8::1")},
			names:    []string{"api.example.com"},
			want:     []fqdn.Address{addr("api.example.com", 60, "192.0.2.1"), addr("api.example.com", 30, "2001:db8::1")},
		},
		{
			name:     "a CNAME chain: the smallest TTL on the way",
			question: "www.example.com.",
			answers: []dns.RR{
				rrCNAME("www.example.com.", 300, "edge.cdn.net."),
				rrCNAME("edge.cdn.net.", 20, "a1.cdn.net."),
				rrA("a1.cdn.net.", 3600, "192.0.2.7"),
				rrA("a1.cdn.net.", 5, "192.0.2.8"),
			},
			names: []string{"www.example.com", "edge.cdn.net", "a1.cdn.net"},
			want:  []fqdn.Address{addr("a1.cdn.net", 20, "192.0.2.7"), addr("a1.cdn.net", 5, "192.0.2.8")},
		},
		{
			name:     "records out of order",
			question: "www.example.com",
			answers:  []dns.RR{rrA("b.example.com.", 10, "192.0.2.2"), rrCNAME("www.example.com.", 60, "b.example.com.")},
			names:    []string{"www.example.com", "b.example.com"},
			want:     []fqdn.Address{addr("b.example.com", 10, "192.0.2.2")},
		},
		{
			name:     "a loop is followed once",
			question: "a.example.com.",
			answers: []dns.RR{
				rrCNAME("a.example.com.", 60, "b.example.com."),
				rrCNAME("b.example.com.", 60, "a.example.com."),
				rrA("b.example.com.", 60, "192.0.2.3"),
			},
			names:   []string{"a.example.com", "b.example.com"},
			want:    []fqdn.Address{addr("b.example.com", 60, "192.0.2.3")},
			skipped: fqdn.Skipped{Loop: 1},
		},
		{
			name:     "a CNAME to itself",
			question: "a.example.com.",
			answers:  []dns.RR{rrCNAME("a.example.com.", 60, "A.example.com."), rrA("a.example.com.", 60, "192.0.2.4")},
			names:    []string{"a.example.com"},
			want:     []fqdn.Address{addr("a.example.com", 60, "192.0.2.4")},
			skipped:  fqdn.Skipped{Loop: 1},
		},
		{
			name:     "records of other names, types and duplicates",
			question: "a.example.com.",
			answers: []dns.RR{
				rrA("evil.example.com.", 60, "192.0.2.66"),
				rrCNAME("other.example.com.", 60, "a.example.com."),
				&dns.TXT{Hdr: dns.RR_Header{Name: "a.example.com.", Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{"x"}},
				rrA("a.example.com.", 60, "192.0.2.5"),
				rrA("a.example.com.", 10, "192.0.2.5"),
				rrCNAME("a.example.com.", 60, "b.example.com."),
				rrCNAME("a.example.com.", 60, "c.example.com."),
				&dns.A{Hdr: dns.RR_Header{Name: "a.example.com.", Rrtype: dns.TypeA, Class: dns.ClassCHAOS, Ttl: 60}, A: net.ParseIP("192.0.2.9")},
			},
			names:   []string{"a.example.com", "b.example.com"},
			want:    []fqdn.Address{addr("a.example.com", 60, "192.0.2.5")},
			skipped: fqdn.Skipped{Unrelated: 2, OtherType: 2, Duplicate: 2},
		},
		{
			name:     "TTLs with the top bit set count as 0",
			question: "a.example.com.",
			answers:  []dns.RR{rrA("a.example.com.", 1<<31, "192.0.2.1"), rrA("a.example.com.", 1<<31-1, "192.0.2.2"), rrA("a.example.com.", 1<<32-1, "192.0.2.3")},
			names:    []string{"a.example.com"},
			want:     []fqdn.Address{addr("a.example.com", 0, "192.0.2.1"), addr("a.example.com", 1<<31-1, "192.0.2.2"), addr("a.example.com", 0, "192.0.2.3")},
		},
		{
			name:     "the chain cut at MaxChain",
			question: "c0.example.com.",
			answers: []dns.RR{
				rrCNAME("c0.example.com.", 60, "c1.example.com."),
				rrCNAME("c1.example.com.", 60, "c2.example.com."),
				rrCNAME("c2.example.com.", 60, "c3.example.com."),
				rrA("c2.example.com.", 60, "192.0.2.2"),
				rrA("c3.example.com.", 60, "192.0.2.3"),
			},
			limits:  fqdn.Limits{MaxChain: 2},
			names:   []string{"c0.example.com", "c1.example.com", "c2.example.com"},
			want:    []fqdn.Address{addr("c2.example.com", 60, "192.0.2.2")},
			skipped: fqdn.Skipped{ChainTooLong: 1, Unrelated: 1}, // c3's A
		},
		{
			name:     "records past MaxRecords",
			question: "a.example.com.",
			answers:  []dns.RR{rrA("a.example.com.", 60, "192.0.2.1"), rrA("a.example.com.", 60, "192.0.2.2"), rrA("a.example.com.", 60, "192.0.2.3")},
			limits:   fqdn.Limits{MaxRecords: 2},
			names:    []string{"a.example.com"},
			want:     []fqdn.Address{addr("a.example.com", 60, "192.0.2.1"), addr("a.example.com", 60, "192.0.2.2")},
			skipped:  fqdn.Skipped{OverLimit: 1},
		},
		{
			name:     "no answer",
			question: "a.example.com.",
			names:    []string{"a.example.com"},
		},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			got := fqdn.ReadAnswer(response(t, dns.Fqdn(test.question), test.answers...), test.question, test.limits)
			require.Equal(t, fqdn.CanonicalName(test.question), got.Question)
			require.Equal(t, test.names, got.Names)
			require.Equal(t, test.want, got.Addresses)
			require.Equal(t, test.skipped, got.Skipped)
		})
	}
}

// TestReadAnswerThousands: a response as large as DNS over TCP carries,
// thousands of records, is read within the limit and the rest counted.
func TestReadAnswerThousands(t *testing.T) {
	var answers []dns.RR
	for i := range 4000 {
		answers = append(answers, rrA("s3.example.com.", uint32(i), fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)))
	}
	msg := response(t, "s3.example.com.", answers...)
	got := fqdn.ReadAnswer(msg, "s3.example.com.", fqdn.Limits{})
	require.Len(t, got.Addresses, 1024)
	require.Equal(t, fqdn.Skipped{OverLimit: 4000 - 1024}, got.Skipped)
	require.Equal(t, 4000-1024, got.Skipped.Total())

	got = fqdn.ReadAnswer(msg, "s3.example.com.", fqdn.Limits{MaxRecords: 5000})
	require.Len(t, got.Addresses, 4000)
	require.Zero(t, got.Skipped.Total())
}

// TestReadAnswerLongChain: a chain of 1,000 CNAMEs is cut at the default
// limit.
func TestReadAnswerLongChain(t *testing.T) {
	var answers []dns.RR
	for i := range 1000 {
		answers = append(answers, rrCNAME(fmt.Sprintf("c%d.example.com.", i), 60, fmt.Sprintf("c%d.example.com.", i+1)))
	}
	answers = append(answers, rrA("c1000.example.com.", 60, "192.0.2.1"))
	got := fqdn.ReadAnswer(response(t, "c0.example.com.", answers...), "c0.example.com.", fqdn.Limits{MaxRecords: 2000})
	require.Len(t, got.Names, 17)
	require.Empty(t, got.Addresses)
	require.Equal(t, 1, got.Skipped.ChainTooLong)
}

func TestReadAnswerNil(t *testing.T) {
	got := fqdn.ReadAnswer(nil, "a.example.com.", fqdn.Limits{})
	require.Equal(t, "a.example.com", got.Question)
	require.Empty(t, got.Addresses)
	msg := &dns.Msg{Answer: []dns.RR{nil, rrA("a.example.com.", 1, "192.0.2.1")}}
	got = fqdn.ReadAnswer(msg, "a.example.com.", fqdn.Limits{})
	require.Len(t, got.Addresses, 1)
	require.Equal(t, 1, got.Skipped.OtherType)
}
