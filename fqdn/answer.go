// SPDX-License-Identifier: Apache-2.0

package fqdn

import (
	"net/netip"

	"github.com/miekg/dns"
)

// Limits bound what [ReadAnswer] reads of one DNS message. The zero value
// takes the defaults.
type Limits struct {
	// MaxRecords is the most answer records read; the rest are counted
	// in Skipped.OverLimit. Default 1024.
	MaxRecords int
	// MaxChain is the most CNAMEs followed from the question name;
	// Skipped.ChainTooLong counts a chain cut there. Default 16.
	MaxChain int
}

const (
	defaultMaxRecords = 1024
	defaultMaxChain   = 16

	// maxTTL is the largest TTL a record keeps: RFC 2181 (section 8)
	// reads a TTL with the top bit set as 0.
	maxTTL = 1<<31 - 1
)

func (l Limits) withDefaults() Limits {
	if l.MaxRecords <= 0 {
		l.MaxRecords = defaultMaxRecords
	}
	if l.MaxChain <= 0 {
		l.MaxChain = defaultMaxChain
	}
	return l
}

// Answer is what a DNS response says the question name resolves to.
type Answer struct {
	// Question is the question name, canonical ([CanonicalName]).
	Question string
	// Names are the names reached from the question by following
	// CNAMEs, the question first, each once, canonical.
	Names []string
	// Addresses are the A and AAAA records of the names reached, each
	// name and address once, in the order the message lists them.
	Addresses []Address
	// Skipped counts the records not read, by why.
	Skipped Skipped
}

// Address is an address a DNS response gives for a name.
type Address struct {
	// Name is the record's owner, one of Answer.Names.
	Name string
	Addr netip.Addr
	// TTL is in seconds: the smallest TTL on the way from the question
	// (the CNAMEs followed and the record's), so that the question name
	// is not kept for longer than any link of its chain. A TTL with the
	// top bit set counts as 0 (RFC 2181).
	TTL uint32
}

// Skipped counts the answer records [ReadAnswer] did not read, by why.
type Skipped struct {
	// OverLimit: records past Limits.MaxRecords.
	OverLimit int
	// Unrelated: records of a name not reached from the question.
	Unrelated int
	// OtherType: records that are not A, AAAA or CNAME, or not class IN.
	OtherType int
	// Duplicate: an address given twice for a name, or a second CNAME
	// for a name (the first is followed).
	Duplicate int
	// ChainTooLong: 1 when the CNAME chain was longer than
	// Limits.MaxChain (the names past it are not reached).
	ChainTooLong int
	// Loop: 1 when the CNAME chain came back to a name already reached.
	Loop int
}

// Total is the number of records skipped, of every kind.
func (s Skipped) Total() int {
	return s.OverLimit + s.Unrelated + s.OtherType + s.Duplicate + s.ChainTooLong + s.Loop
}

// ReadAnswer reads the addresses msg's answer section gives for question
// (the name the client asked for, as sent or canonical): the A and AAAA
// records of the question name and of the names its CNAME chain reaches,
// each with the TTL it may be kept for. It reads at most limits.MaxRecords
// records and follows at most limits.MaxChain CNAMEs, stops at a loop,
// and counts what it skipped; it never fails: a record it cannot use is
// skipped. The caller checks msg.Rcode and that msg answers the question
// it asked; a nil msg has no answer.
func ReadAnswer(msg *dns.Msg, question string, limits Limits) Answer {
	limits = limits.withDefaults()
	answer := Answer{Question: CanonicalName(question)}
	if msg == nil {
		return answer
	}
	records := msg.Answer
	if len(records) > limits.MaxRecords {
		answer.Skipped.OverLimit = len(records) - limits.MaxRecords
		records = records[:limits.MaxRecords]
	}

	// First pass: each name's CNAME target, with its TTL. A canonical
	// name per record costs an allocation only for upper case.
	type alias struct {
		target string
		ttl    uint32
	}
	var aliases map[string]alias
	for _, rr := range records {
		cname, ok := rr.(*dns.CNAME)
		if !ok || cname.Hdr.Class != dns.ClassINET {
			continue
		}
		if aliases == nil {
			aliases = make(map[string]alias)
		}
		owner := CanonicalName(cname.Hdr.Name)
		if _, dup := aliases[owner]; dup {
			answer.Skipped.Duplicate++
			continue
		}
		aliases[owner] = alias{CanonicalName(cname.Target), clampTTL(cname.Hdr.Ttl)}
	}

	// Follow the chain: each name reached, with the smallest TTL on the
	// way to it.
	reached := map[string]uint32{answer.Question: maxTTL}
	answer.Names = append(answer.Names, answer.Question)
	name, ttl := answer.Question, uint32(maxTTL)
	for {
		next, ok := aliases[name]
		if !ok {
			break
		}
		if _, seen := reached[next.target]; seen {
			answer.Skipped.Loop = 1
			break
		}
		if len(answer.Names) > limits.MaxChain {
			answer.Skipped.ChainTooLong = 1
			break
		}
		name, ttl = next.target, min(ttl, next.ttl)
		reached[name] = ttl
		answer.Names = append(answer.Names, name)
	}

	// Second pass: the addresses of the names reached.
	type key struct {
		name string
		addr netip.Addr
	}
	var seen map[key]struct{}
	for _, rr := range records {
		if rr == nil { // only a message built in memory, not one unpacked
			answer.Skipped.OtherType++
			continue
		}
		var addr netip.Addr
		switch rr := rr.(type) {
		case *dns.A:
			addr, _ = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			addr, _ = netip.AddrFromSlice(rr.AAAA.To16())
		case *dns.CNAME:
			if rr.Hdr.Class == dns.ClassINET {
				if _, ok := reached[CanonicalName(rr.Hdr.Name)]; !ok {
					answer.Skipped.Unrelated++
				}
				continue
			}
		}
		hdr := rr.Header()
		if !addr.IsValid() || hdr.Class != dns.ClassINET {
			answer.Skipped.OtherType++
			continue
		}
		owner := CanonicalName(hdr.Name)
		chainTTL, ok := reached[owner]
		if !ok {
			answer.Skipped.Unrelated++
			continue
		}
		if seen == nil {
			seen = make(map[key]struct{})
		}
		k := key{owner, addr}
		if _, dup := seen[k]; dup {
			answer.Skipped.Duplicate++
			continue
		}
		seen[k] = struct{}{}
		answer.Addresses = append(answer.Addresses, Address{Name: owner, Addr: addr, TTL: min(chainTTL, clampTTL(hdr.Ttl))})
	}
	return answer
}

func clampTTL(ttl uint32) uint32 {
	if ttl > maxTTL {
		return 0
	}
	return ttl
}
