// SPDX-License-Identifier: Apache-2.0

package prefixkey

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeysOrderByFamilyAddressLength(t *testing.T) {
	ordered := []string{"0.0.0.0/0", "10.0.0.0/8", "10.0.0.0/16", "10.0.0.1/32", "10.255.255.255/32",
		"11.0.0.0/8", "::/0", "::a00:0/104", "2001:db8::/32", "2001:db8:1::/48"}
	var keys [][]byte
	for _, s := range ordered {
		p := netip.MustParsePrefix(s)
		key := Append(nil, p)
		require.Len(t, key, Len(p), s)
		keys = append(keys, key)
	}
	require.True(t, slices.IsSortedFunc(keys, bytes.Compare))
}

func TestRangeOfACIDR(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/16")
	start := RangeStart(cidr)
	for s, want := range map[string][2]bool{ // in range, inside
		"10.0.0.0/8":    {true, false},
		"10.0.0.0/16":   {true, true},
		"10.0.255.1/32": {true, true},
		"10.1.0.0/16":   {false, false},
		"::a00:0/104":   {false, false},
	} {
		p := netip.MustParsePrefix(s)
		require.GreaterOrEqual(t, bytes.Compare(Append(nil, p), start), 0, s)
		require.Equal(t, want[0], InRange(cidr, p), s)
		require.Equal(t, want[1], Inside(cidr, p), s)
	}
	require.Negative(t, bytes.Compare(Append(nil, netip.MustParsePrefix("9.255.255.255/32")), start))
}

// Compare is the order of the keys: sorting prefixes with it sorts their
// keys.
func TestCompareIsKeyOrder(t *testing.T) {
	var prefixes []netip.Prefix
	for _, s := range []string{"10.0.0.0/8", "10.0.0.0/16", "9.1.2.3/32", "::1/128", "::/0", "10.0.0.1/32", "0.0.0.0/0", "fd00::/8"} {
		prefixes = append(prefixes, netip.MustParsePrefix(s))
	}
	for i := range prefixes {
		for j := range prefixes {
			a, b := prefixes[i], prefixes[j]
			require.Equal(t, bytes.Compare(Append(nil, a), Append(nil, b)), max(-1, min(1, Compare(a, b))), "%s vs %s", a, b)
		}
	}
}

func TestParseInvertsAppend(t *testing.T) {
	for _, s := range []string{"0.0.0.0/0", "10.0.0.0/8", "192.0.2.1/32", "::/0", "2001:db8::/32", "::ffff:10.0.0.0/104", "ff::1/128"} {
		p := netip.MustParsePrefix(s)
		got, ok := Parse(Append(nil, p))
		require.True(t, ok, s)
		require.Equal(t, p, got, s)
		got, ok = Parse(string(Append(nil, p)))
		require.True(t, ok, s)
		require.Equal(t, p, got, s)
	}
	for _, bad := range [][]byte{nil, {4, 10, 0, 0, 0}, {4, 10, 0, 0, 1, 8}, {4, 10, 0, 0, 0, 33}, {5, 10, 0, 0, 0, 8}, {6, 1}} {
		_, ok := Parse(bad)
		require.False(t, ok, "%x", bad)
	}
}

func TestLenOf(t *testing.T) {
	for _, s := range []string{"10.0.0.0/8", "2001:db8::/32"} {
		p := netip.MustParsePrefix(s)
		require.Equal(t, Len(p), LenOf(Append(nil, p)[0]), s)
		require.LessOrEqual(t, Len(p), MaxLen, s)
	}
	require.Zero(t, LenOf(0))
}
