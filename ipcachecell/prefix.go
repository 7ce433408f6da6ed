package ipcachecell

import (
	"fmt"
	"iter"
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Prefixes are keyed as family (4 or 6), the address bytes (4 or 16), then
// the prefix length: a fixed length per family, ordered by address. All
// prefixes inside a CIDR are then one contiguous range of keys, starting at
// the CIDR's own address, so a containment query is a lower-bound seek and a
// scan that stops at the first key past the CIDR. Measured at 1M prefixes
// (DESIGN.md section 4), statedb's secondary LPM index made inserts about 4
// times slower and doubled memory; this key costs nothing extra.

const (
	familyIPv4 = 4
	familyIPv6 = 6
)

// prefixKey returns the key of a prefix. The prefix must be valid and
// masked.
func prefixKey(prefix netip.Prefix) index.Key {
	addr := prefix.Addr()
	if addr.Is4() {
		a := addr.As4()
		return index.Key{familyIPv4, a[0], a[1], a[2], a[3], byte(prefix.Bits())}
	}
	a := addr.As16()
	key := make(index.Key, 0, 18)
	key = append(key, familyIPv6)
	key = append(key, a[:]...)
	return append(key, byte(prefix.Bits()))
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
		start := prefixKey(netip.PrefixFrom(cidr.Addr(), 0))
		for obj := range table.LowerBound(txn, query(start)) {
			prefix := prefixOf(obj)
			if prefix.Addr().BitLen() != cidr.Addr().BitLen() || !cidr.Contains(prefix.Addr()) {
				return // past the CIDR's range of keys
			}
			if prefix.Bits() >= cidr.Bits() && !yield(obj) {
				return
			}
		}
	}
}
