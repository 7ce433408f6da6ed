// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"bytes"
	"cmp"
	"fmt"
	"iter"
	"net/netip"
	"unsafe"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

// prefixKey returns the key of a prefix (package prefixkey: prefixes inside
// a CIDR are one range of keys). The prefix must be valid and masked.
//
// It builds queries' keys only (rows share their own bytes as keys). A
// query's key is garbage at once, so it gets a block of at least 16 bytes:
// a smaller one goes to the runtime's tiny allocator, packed into a
// 16-byte block beside the small keys the tables keep, and a block is
// freed only when all it holds is (docs/SCALE.md).
func prefixKey(prefix netip.Prefix) index.Key {
	return prefixkey.Append(make(index.Key, 0, max(prefixkey.Len(prefix), 16)), prefix)
}

// compactPrefix is a prefix without netip.Addr's zone pointer: a Go map
// keyed by it is a flat table that the garbage collector does not scan,
// and hashes 18 bytes, not 32. The handles' sets of their prefixes and the
// resolver's queue hold up to a million of them.
type compactPrefix struct {
	addr [16]byte
	bits uint8
	is4  bool
}

func compact(prefix netip.Prefix) compactPrefix {
	return compactPrefix{addr: prefix.Addr().As16(), bits: uint8(prefix.Bits()), is4: prefix.Addr().Is4()}
}

// compare orders as prefixkey.Compare does: IPv4 first, then by address,
// then by length.
func (k compactPrefix) compare(other compactPrefix) int {
	if k.is4 != other.is4 {
		if k.is4 {
			return -1
		}
		return 1
	}
	if c := bytes.Compare(k.addr[:], other.addr[:]); c != 0 {
		return c
	}
	return cmp.Compare(k.bits, other.bits)
}

func (k compactPrefix) prefix() netip.Prefix {
	addr := netip.AddrFrom16(k.addr)
	if k.is4 {
		addr = addr.Unmap()
	}
	return netip.PrefixFrom(addr, int(k.bits))
}

// packedPrefix is a prefix as its key (package prefixkey), in 18 bytes
// and no pointer, where a netip.Prefix takes 32 (its address's zone
// pointer and padding). An entry holds it (Entry), and the `ipcache`
// table's index keys the entry by these very bytes (key), not by a copy
// of them. Its zero value is the invalid prefix (no family).
type packedPrefix [prefixkey.MaxLen]byte

func pack(prefix netip.Prefix) packedPrefix {
	var p packedPrefix
	if prefix.IsValid() {
		prefixkey.Append(p[:0], prefix)
	}
	return p
}

// key returns the prefix's key, which is p's own bytes: what holds the
// key holds p.
func (p *packedPrefix) key() []byte {
	return p[:prefixkey.LenOf(p[0])]
}

// keyString returns key's bytes as a string that shares them: p must not
// change while the string lives (a written Entry never does).
func (p *packedPrefix) keyString() string {
	k := p.key()
	return unsafe.String(&k[0], len(k))
}

func (p *packedPrefix) unpack() netip.Prefix {
	prefix, _ := prefixkey.Parse(p.key()) // invalid if p is zero
	return prefix
}

// canonicalPrefix validates the prefix and clears its host bits.
func canonicalPrefix(prefix netip.Prefix) (netip.Prefix, error) {
	if !prefix.IsValid() {
		return netip.Prefix{}, fmt.Errorf("invalid prefix %q", prefix)
	}
	if prefix.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("prefix %s: zones are not allowed", prefix)
	}
	return prefix.Masked(), nil
}

func prefixKeyFromString(s string) (index.Key, error) {
	prefix, err := netip.ParsePrefix(s)
	if err == nil {
		prefix, err = canonicalPrefix(prefix)
	}
	if err != nil {
		return nil, err
	}
	return prefixKey(prefix), nil
}

// Within returns the rows of table whose prefix lies inside cidr (cidr
// itself included), in address order. The table's primary index must be
// keyed by prefixKey (the `ipcache` table is), or begin with it (the
// `ipcache-metadata` table); prefixOf returns a row's prefix.
func within[Obj any](txn statedb.ReadTxn, table statedb.Table[Obj], query func(index.Key) statedb.Query[Obj],
	prefixOf func(Obj) netip.Prefix, cidr netip.Prefix) iter.Seq[Obj] {
	return func(yield func(Obj) bool) {
		cidr, err := canonicalPrefix(cidr)
		if err != nil {
			return
		}
		for obj := range table.LowerBound(txn, query(prefixkey.RangeStart(cidr))) {
			prefix := prefixOf(obj)
			if !prefixkey.InRange(cidr, prefix) {
				return // past the CIDR's range of keys
			}
			if prefix.Bits() >= cidr.Bits() && !yield(obj) {
				return
			}
		}
	}
}
