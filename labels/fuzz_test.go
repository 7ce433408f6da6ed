// SPDX-License-Identifier: Apache-2.0

package labels

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// FuzzParse: whatever Parse accepts is canonical: printing and parsing
// again gives the same set.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"", "cidr:10.0.0.0/8", "reserved:world,cidr:::/0", "a:b,a:b", "cidr:10.0.0.1/8", ":x", "a:b c"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(l.String())
		if err != nil || again != l {
			t.Fatalf("Parse(%q) = %q, which parses to %q, %v", s, l, again, err)
		}
		for p := range l.Prefixes() {
			if !l.Has(CIDRLabel(p)) {
				t.Fatalf("prefix %s of %q has no cidr label", p, l)
			}
		}
	})
}

// FuzzCIDRLabel: the prefix of a cidr label, as it comes from a checkpoint,
// a shell command or an embedding agent. A label is accepted only in the
// canonical form ForPrefix writes, so that one prefix has exactly one
// label set (and so one identity); and every prefix netip parses has a
// label that parses back to that prefix, masked.
func FuzzCIDRLabel(f *testing.F) {
	for _, seed := range []string{"10.0.0.0/8", "10.0.0.1/8", "0.0.0.0/0", "::/0", "2001:db8::/32",
		"2001:DB8::/32", "2001:db8:0::/48", "::ffff:10.0.0.0/104", "10.0.0.0/33", "fe80::%eth0/64",
		"10.0.0.0/08", "10.0.0.0", "1.2.3.4/32", "::/129", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if prefix, err := netip.ParsePrefix(s); err == nil {
			l := ForPrefix(prefix)
			back, err := Parse(l.String())
			if err != nil || back != l {
				t.Fatalf("ForPrefix(%s) = %q parses to %q, %v", prefix, l, back, err)
			}
			if got := slices.Collect(back.Prefixes()); len(got) != 1 || got[0] != prefix.Masked() {
				t.Fatalf("ForPrefix(%s) = %q names %v, want %s", prefix, l, got, prefix.Masked())
			}
		}
		if strings.Contains(s, separator) {
			return // more than one label: FuzzParse's business
		}
		l, err := Parse(SourceCIDR + ":" + s)
		if err != nil {
			return
		}
		got := slices.Collect(l.Prefixes())
		if len(got) != 1 {
			t.Fatalf("cidr label %q names %v, want one prefix", s, got)
		}
		if canonical := ForPrefix(got[0]); canonical != l {
			t.Fatalf("cidr label %q accepted but not canonical: %s is %q, a different label set", l, got[0], canonical)
		}
	})
}
