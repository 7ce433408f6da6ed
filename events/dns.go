// SPDX-License-Identifier: Apache-2.0

package events

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// DNS events come from user space, not from the program: the DNS proxy
// publishes one per query it handled, and the monitor shows them beside
// the program's events (docs/CONTRACT.md "Monitor events").

// MaxDNSAddresses bounds a DNS event's Addresses: the monitor keeps up to
// a subscriber's buffer of events per client, and an answer may list
// many.
const MaxDNSAddresses = 32

// DNSVerdict is what the proxy did with a query.
type DNSVerdict uint8

const (
	// DNSForwarded: the DNS rules allow the name; the query went to its
	// server and the server's answer to the client.
	DNSForwarded DNSVerdict = iota + 1
	// DNSRefused: the DNS rules do not allow the name; the client got the
	// reject response code.
	DNSRefused
	// DNSFailed: the server did not answer (or not usably); the client
	// got SERVFAIL or nothing.
	DNSFailed
)

func (v DNSVerdict) String() string {
	switch v {
	case DNSForwarded:
		return "forwarded"
	case DNSRefused:
		return "refused"
	case DNSFailed:
		return "failed"
	}
	return "dns-verdict-" + strconv.Itoa(int(v))
}

// DNS is one query the DNS proxy handled.
type DNS struct {
	Time time.Time
	// Client is the querying endpoint's address and port; Server the
	// address and port the query was sent to (and answered from).
	Client, Server netip.AddrPort
	// Endpoint is the client's endpoint identity, 0 for the host-wide
	// default's.
	Endpoint identity.Number
	// Name is the question's name, canonical: lower case, no final dot.
	Name string
	// Type is the question's type (dns.TypeA, ...).
	Type uint16
	// Rcode is the response code the client got.
	Rcode int
	// Addresses are the answer's A and AAAA addresses, CNAME chains
	// followed, at most MaxDNSAddresses. Once published, the slice is the
	// monitor's: the publisher must not modify it.
	Addresses []netip.Addr
	Verdict   DNSVerdict
	// Held is how long the answer was held until its addresses were
	// allowed in the kernel's maps.
	Held time.Duration
}

// DNSPublisher takes the DNS proxy's events (the monitor's hub provides
// it). PublishDNS never blocks: an event no subscriber has room for is
// lost and counted, and with no subscriber it is dropped at once.
type DNSPublisher interface {
	PublishDNS(DNS)
}
