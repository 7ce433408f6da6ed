package labels

import "testing"

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
