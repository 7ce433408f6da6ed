// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// Lookup is a packet as the enforcement program looks it up in the
// policy map (docs/CONTRACT.md, "Policy semantics").
type Lookup struct {
	// Subject is the local endpoint identity whose policy applies (0:
	// the host-wide default's).
	Subject identity.Number
	// Identity is the remote address's.
	Identity  identity.Number
	Direction Direction
	Protocol  Protocol
	// Port is the destination port; for ICMP and ICMPv6 the type in the
	// high byte and the code in the low one.
	Port uint16
	// HasPort: the packet has a port (TCP, UDP or SCTP with its header,
	// not a later fragment) or an ICMP type. Without, only entries for
	// every port of its protocol or for any protocol match it.
	HasPort bool
}

// Key returns the key the program looks up for the identity id (the
// remote one, or 0 for any identity).
func (l Lookup) Key(id identity.Number) Key {
	k := Key{Subject: l.Subject, Identity: id, Direction: l.Direction, Protocol: l.Protocol, Port: l.Port}
	if !l.HasPort || l.Protocol == ProtocolAny {
		k.Port, k.PortWildcardBits = 0, 16
	}
	return k
}

// Match is what one lookup of the policy map found.
type Match struct {
	// Key is the key looked up; Matched the entry's key, if Found.
	Key     Key
	Matched Key
	Verdict Verdict
	Found   bool
}

// Resolution is the outcome of the program's two lookups: the
// remote identity's key and identity 0's (any identity).
type Resolution struct {
	Remote, Any Match
	// Decided is the match that decides: a deny from either lookup (the
	// remote identity's first), else a dns-proxy from either (it allows,
	// and the packet goes to the DNS proxy even when the other lookup
	// finds a plain allow), else an allow from either. Not Found: no
	// entry matches, and the direction's default applies (drop when
	// enforced with default deny, pass with deny rules only).
	Decided Match
}

// LookupFunc looks a key up as the program's longest-prefix lookup does:
// it returns the entry with the longest prefix that matches the key (the
// identity and direction, then the protocol and the port bits its block
// fixes).
type LookupFunc func(key Key) (matched Key, verdict Verdict, found bool, err error)

// Resolve resolves a packet as the enforcement program does, with
// lookup over the policy map or (DesiredLookup) the desired table.
//
// Possible errors: those of lookup.
func Resolve(l Lookup, lookup LookupFunc) (Resolution, error) {
	var r Resolution
	for _, m := range []*Match{&r.Remote, &r.Any} {
		id := l.Identity
		if m == &r.Any {
			id = 0
		}
		m.Key = l.Key(id)
		var err error
		if m.Matched, m.Verdict, m.Found, err = lookup(m.Key); err != nil {
			return r, err
		}
	}
	switch {
	case r.Remote.Found && r.Remote.Verdict == VerdictDeny:
		r.Decided = r.Remote
	case r.Any.Found && r.Any.Verdict == VerdictDeny:
		r.Decided = r.Any
	case r.Remote.Found && r.Remote.Verdict == VerdictDNSProxy:
		r.Decided = r.Remote
	case r.Any.Found && r.Any.Verdict == VerdictDNSProxy:
		r.Decided = r.Any
	case r.Remote.Found:
		r.Decided = r.Remote
	case r.Any.Found:
		r.Decided = r.Any
	default:
		r.Decided = Match{Key: r.Remote.Key}
	}
	return r, nil
}

// LookupEntries finds the entry the program's longest-prefix lookup of
// key would find among those get returns: the key's port block widened
// bit by bit up to the whole protocol, then any protocol (at most 18
// gets).
func LookupEntries(key Key, get func(Key) (*Entry, bool)) (*Entry, bool) {
	if key.Protocol != ProtocolAny {
		for bits := key.PortWildcardBits; bits <= 16; bits++ {
			k := key
			k.PortWildcardBits, k.Port = bits, uint16(uint32(key.Port)>>bits<<bits)
			if e, found := get(k); found {
				return e, true
			}
		}
	}
	return get(Key{Subject: key.Subject, Identity: key.Identity, Direction: key.Direction})
}

// DesiredLookup is a PolicyLookupFunc over the desired `policy` table;
// with writtenOnly, over its entries the datapath wrote (not those whose
// status is an error).
func DesiredLookup(txn statedb.ReadTxn, entries statedb.Table[*Entry], writtenOnly bool) LookupFunc {
	return func(key Key) (Key, Verdict, bool, error) {
		e, found := LookupEntries(key, func(k Key) (*Entry, bool) {
			e, _, found := entries.Get(txn, KeyIndex.Query(k))
			if found && writtenOnly && e.Status.Kind == reconciler.StatusKindError {
				return nil, false
			}
			return e, found
		})
		if !found {
			return Key{}, 0, false, nil
		}
		return e.Key, e.Verdict, true, nil
	}
}

// Behind returns the entry of the desired `policy` table that
// decides the packet as the program resolves it (a deny from the remote
// identity or identity 0, else a dns-proxy, else an allow), nil if none matches: for naming
// the policies behind a datapath event.
func Behind(txn statedb.ReadTxn, entries statedb.Table[*Entry], l Lookup) *Entry {
	r, _ := Resolve(l, DesiredLookup(txn, entries, false))
	if !r.Decided.Found {
		return nil
	}
	e, _, found := entries.Get(txn, KeyIndex.Query(r.Decided.Matched))
	if !found {
		return nil
	}
	return e
}
