// SPDX-License-Identifier: Apache-2.0

package labels

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

func TestNewIsCanonical(t *testing.T) {
	a, err := New("reserved:world", "cidr:10.0.0.0/8", "reserved:world")
	require.NoError(t, err)
	b, err := Parse("cidr:10.0.0.0/8,reserved:world")
	require.NoError(t, err)
	require.Equal(t, a, b, "same members must give equal sets")
	require.Equal(t, "cidr:10.0.0.0/8,reserved:world", a.String())
	require.Equal(t, 2, a.Len())
	require.True(t, a.Has("reserved:world"))
	require.False(t, a.Has("reserved:host"))
}

func TestInvalidLabels(t *testing.T) {
	for _, bad := range []string{
		"", "nocolon", ":value", "source:", "a:b,c", "a:b c",
		"cidr:10.0.0.1/8", // host bits set
		"cidr:banana", "cidr:10.0.0.0/33",
	} {
		_, err := New(bad)
		require.ErrorIs(t, err, ErrInvalidLabel, "label %q", bad)
	}
}

func TestEmpty(t *testing.T) {
	empty, err := Parse("")
	require.NoError(t, err)
	require.True(t, empty.IsEmpty())
	require.Equal(t, 0, empty.Len())
	require.Empty(t, slices.Collect(empty.All()))
}

func TestUnionAndPrefixes(t *testing.T) {
	v4 := ForPrefix(netip.MustParsePrefix("10.1.0.0/16"))
	v6 := ForPrefix(netip.MustParsePrefix("2001:db8::/32"))
	world, _ := New("reserved:world")

	all := v4.Union(v6).Union(world).Union(v4)
	require.Equal(t, "cidr:10.1.0.0/16,cidr:2001:db8::/32,reserved:world", all.String())
	require.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("2001:db8::/32"),
	}, slices.Collect(all.Prefixes()))
	require.Equal(t, slices.Collect(all.Prefixes()), all.AppendPrefixes(nil))
	var one [1]netip.Prefix
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, v4.AppendPrefixes(one[:0]))
	require.Equal(t, netip.MustParsePrefix("10.1.0.0/16"), one[0], "appended in place")
	require.Zero(t, testing.AllocsPerRun(10, func() { v4.AppendPrefixes(one[:0]) }))
	require.Empty(t, world.AppendPrefixes(nil))
	require.Equal(t, v4, v4.Union(Labels{}))
	require.Equal(t, v4, Labels{}.Union(v4))
}

func TestForPrefixMasks(t *testing.T) {
	require.Equal(t, "cidr:10.0.0.0/8", ForPrefix(netip.MustParsePrefix("10.1.2.3/8")).String())
}

func TestJSONRoundTrip(t *testing.T) {
	in, _ := New("cidr:192.0.2.0/24", "reserved:world")
	data, err := json.Marshal(in)
	require.NoError(t, err)
	require.JSONEq(t, `"cidr:192.0.2.0/24,reserved:world"`, string(data))

	var out Labels
	require.NoError(t, json.Unmarshal(data, &out))
	require.Equal(t, in, out)
	require.Error(t, json.Unmarshal([]byte(`"bogus"`), &out))
}

// A set of labels is a field of its own in YAML, left out by omitempty
// only when empty.
func TestYAMLRoundTrip(t *testing.T) {
	type row struct {
		Labels Labels `yaml:"labels,omitempty"`
	}
	in, _ := New("cidr:192.0.2.0/24", "app:x")
	data, err := yaml.Marshal(row{Labels: in})
	require.NoError(t, err)
	require.Equal(t, "labels: app:x,cidr:192.0.2.0/24\n", string(data))
	var out row
	require.NoError(t, yaml.Unmarshal(data, &out))
	require.Equal(t, in, out.Labels)

	data, err = yaml.Marshal(row{})
	require.NoError(t, err)
	require.Equal(t, "{}\n", string(data))
}

// A single label parses to itself, as the general path gives it, and is
// validated as strictly; IsForPrefix tells a prefix's own label set.
func TestParseSingleLabel(t *testing.T) {
	for _, s := range []string{"cidr:10.0.0.0/8", "app:x", "cidr:2001:db8::/32", "cidr:::ffff:10.0.0.1/128"} {
		got, err := Parse(s)
		require.NoError(t, err, s)
		want, err := New(s)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, s := range []string{"cidr:10.0.0.1/8", "cidr:2001:DB8::/32", "nosource", "cidr:10.0.0.0/33", "a: b"} {
		_, err := Parse(s)
		require.ErrorIs(t, err, ErrInvalidLabel, s)
	}

	p := netip.MustParsePrefix("10.1.2.3/16")
	require.True(t, ForPrefix(p).IsForPrefix(p))
	require.True(t, ForPrefix(p).IsForPrefix(netip.MustParsePrefix("10.1.0.0/16")))
	require.False(t, ForPrefix(p).IsForPrefix(netip.MustParsePrefix("10.1.0.0/17")))
	require.False(t, ForPrefix(p).Union(mustNew(t, "app:x")).IsForPrefix(p))
	require.False(t, Labels{}.IsForPrefix(p))
	v6 := netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")
	require.True(t, ForPrefix(v6).IsForPrefix(v6), "the longest label")
}

func mustNew(t *testing.T, lbls ...string) Labels {
	t.Helper()
	l, err := New(lbls...)
	require.NoError(t, err)
	return l
}

// CIDRLabel reads as the source, a colon and the masked prefix's text,
// for both families and for the zero prefix.
func TestCIDRLabelText(t *testing.T) {
	for in, want := range map[netip.Prefix]string{
		netip.MustParsePrefix("10.1.2.3/8"):                                  "cidr:10.0.0.0/8",
		netip.MustParsePrefix("255.255.255.255/32"):                          "cidr:255.255.255.255/32",
		netip.MustParsePrefix("2001:db8::1/32"):                              "cidr:2001:db8::/32",
		netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"): "cidr:ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
		{}: "cidr:invalid Prefix",
	} {
		if got := CIDRLabel(in); got != want {
			t.Errorf("CIDRLabel(%v) = %q, want %q", in, got, want)
		}
	}
}

// A set that is one cidr label alone is held as its prefix's key, whatever
// built it: every constructor gives the same value, which reads as the
// label's text everywhere.
func TestOnePrefixSetsAreOneValue(t *testing.T) {
	for _, s := range []string{"10.0.0.0/8", "192.0.2.1/32", "0.0.0.0/0", "2001:db8::/32", "::/0", "::ffff:10.0.0.0/104"} {
		prefix := netip.MustParsePrefix(s)
		label := "cidr:" + s
		byPrefix := ForPrefix(prefix)
		parsed, err := Parse(label)
		require.NoError(t, err)
		built, err := New(label, label)
		require.NoError(t, err)
		world, _ := New("reserved:world")
		withWorld := byPrefix.Union(world)
		var unmarshalled Labels
		require.NoError(t, unmarshalled.UnmarshalText([]byte(label)))
		for _, same := range []Labels{parsed, built, unmarshalled, Labels{}.Union(byPrefix)} {
			require.Equal(t, byPrefix, same, s)
			require.True(t, byPrefix == same, s)
		}
		require.NotEqual(t, byPrefix, withWorld)

		require.Equal(t, label, byPrefix.String())
		text, err := byPrefix.MarshalText()
		require.NoError(t, err)
		require.Equal(t, label, string(text))
		appended, err := byPrefix.AppendText([]byte("x="))
		require.NoError(t, err)
		require.Equal(t, "x="+label, string(appended))
		require.Equal(t, 1, byPrefix.Len())
		require.Equal(t, []string{label}, slices.Collect(byPrefix.All()))
		require.True(t, byPrefix.Has(label))
		require.Equal(t, []netip.Prefix{prefix}, slices.Collect(byPrefix.Prefixes()))
		require.True(t, byPrefix.IsForPrefix(prefix))
		require.False(t, withWorld.IsForPrefix(prefix))
		only, ok := byPrefix.OnlyPrefix()
		require.True(t, ok)
		require.Equal(t, prefix, only)
		require.Equal(t, string(prefixkey.Append(nil, prefix)), byPrefix.PrefixKey())
		require.Empty(t, withWorld.PrefixKey())
		_, ok = withWorld.OnlyPrefix()
		require.False(t, ok)
		require.Equal(t, "cidr:"+s+",reserved:world", withWorld.String())
		require.Equal(t, []netip.Prefix{prefix}, slices.Collect(withWorld.Prefixes()))

		data, err := json.Marshal(byPrefix)
		require.NoError(t, err)
		require.JSONEq(t, `"`+label+`"`, string(data))
	}
	other, _ := New("reserved:world")
	require.Empty(t, other.PrefixKey())
	require.Empty(t, Labels{}.PrefixKey())
	require.Equal(t, 1, other.Len())
}

// No label text may start as a packed set does, or two sets would share a
// value.
func TestControlCharactersRejected(t *testing.T) {
	for _, bad := range []string{"\x04a:b", "a:\x06", "a:b\x7f", "k8s:a\x00"} {
		_, err := New(bad)
		require.ErrorIs(t, err, ErrInvalidLabel, "label %q", bad)
		_, err = Parse(bad)
		require.ErrorIs(t, err, ErrInvalidLabel, "label %q", bad)
	}
}

// ForPrefixKey is ForPrefix over the caller's bytes: the same set, and
// nothing but a masked prefix's key is taken.
func TestForPrefixKey(t *testing.T) {
	for _, s := range []string{"10.0.0.0/8", "192.0.2.1/32", "0.0.0.0/0", "2001:db8::/32", "::/0"} {
		prefix := netip.MustParsePrefix(s)
		key := string(prefixkey.Append(nil, prefix))
		l, ok := ForPrefixKey(key)
		require.True(t, ok, s)
		require.Equal(t, ForPrefix(prefix), l, s)
		require.Same(t, unsafe.StringData(key), unsafe.StringData(l.PrefixKey()), "%s: the caller's bytes", s)
	}
	masked := prefixkey.Append(nil, netip.MustParsePrefix("10.0.0.0/8"))
	masked[4] = 1 // 10.0.0.1/8
	unmasked := string(masked)
	for _, key := range []string{"", "cidr:10.0.0.0/8", unmasked} {
		_, ok := ForPrefixKey(key)
		require.False(t, ok, "%q", key)
	}
}
