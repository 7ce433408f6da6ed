// SPDX-License-Identifier: Apache-2.0

// Package prefixkey encodes IP prefixes as index keys: the family (4 or
// 6), the address bytes (4 or 16), then the prefix length. Keys order
// prefixes by family, then address, then length, so all prefixes inside a
// CIDR are one contiguous range of keys, starting at the CIDR's own
// address with length 0: a containment query is a lower-bound seek and a
// scan that stops at the first key past the CIDR.
//
// The `ipcache` and `ipcache-metadata` tables and the identities' labels
// index use it instead of a secondary LPM index, which made inserts slower
// and took more memory at scale (docs/SCALE.md); this key costs nothing
// extra.
package prefixkey

import "net/netip"

const (
	familyIPv4 = 4
	familyIPv6 = 6
)

// MaxLen is the length of the longest key, an IPv6 prefix's.
const MaxLen = 1 + 16 + 1

// LenOf returns the length of a key that starts with family, its first
// byte, and 0 if family is not one Append writes.
func LenOf(family byte) int {
	switch family {
	case familyIPv4:
		return 1 + 4 + 1
	case familyIPv6:
		return MaxLen
	default:
		return 0
	}
}

// Len returns the length of the key of a prefix.
func Len(prefix netip.Prefix) int {
	if prefix.Addr().Is4() {
		return 1 + 4 + 1
	}
	return 1 + 16 + 1
}

// Append appends the key of a prefix to dst. The prefix must be valid and
// masked.
func Append(dst []byte, prefix netip.Prefix) []byte {
	addr := prefix.Addr()
	if addr.Is4() {
		a := addr.As4()
		dst = append(append(dst, familyIPv4), a[:]...)
	} else {
		a := addr.As16()
		dst = append(append(dst, familyIPv6), a[:]...)
	}
	return append(dst, byte(prefix.Bits()))
}

// Parse returns the prefix of a key Append wrote, and false for anything
// else.
func Parse[Key ~string | ~[]byte](key Key) (netip.Prefix, bool) {
	var addr netip.Addr
	switch {
	case len(key) == 1+4+1 && key[0] == familyIPv4:
		addr = netip.AddrFrom4([4]byte{key[1], key[2], key[3], key[4]})
	case len(key) == 1+16+1 && key[0] == familyIPv6:
		var a [16]byte
		copy(a[:], key[1:17])
		addr = netip.AddrFrom16(a)
	default:
		return netip.Prefix{}, false
	}
	prefix := netip.PrefixFrom(addr, int(key[len(key)-1]))
	return prefix, prefix.IsValid() && prefix == prefix.Masked()
}

// RangeStart returns the first key of the range of prefixes inside cidr:
// the key of cidr's address with length 0. The caller stops at the first
// prefix whose address cidr does not contain (see InRange).
func RangeStart(cidr netip.Prefix) []byte {
	return Append(make([]byte, 0, Len(cidr)), netip.PrefixFrom(cidr.Addr(), 0))
}

// InRange reports whether a prefix found at or after RangeStart(cidr) is
// still in the range: its address is inside cidr. Inside the range, a
// prefix shorter than cidr (same address, fewer bits) is not inside cidr.
func InRange(cidr, prefix netip.Prefix) bool {
	return prefix.Addr().BitLen() == cidr.Addr().BitLen() && cidr.Contains(prefix.Addr())
}

// Inside reports whether prefix lies inside cidr (cidr itself included).
func Inside(cidr, prefix netip.Prefix) bool {
	return InRange(cidr, prefix) && prefix.Bits() >= cidr.Bits()
}

// Compare orders prefixes as their keys do: family, address, length. It is
// the one prefix order of the project: batches are written, resolved and
// restored in it, the order in which the kernel's LPM trie inserts fastest.
func Compare(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
