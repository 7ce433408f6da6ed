package policycell

import (
	"strings"
	"testing"
)

// FuzzParseFile: the policy parser never panics, and an error always names
// the file.
func FuzzParseFile(f *testing.F) {
	f.Add([]byte("name: a\negress:\n  - toCIDR: [\"10.0.0.0/8\"]\n    toPorts: [{port: 53, protocol: UDP}]\n"))
	f.Add([]byte("name: b\ningress:\n  - fromCIDR: [\"2001:db8::/32\"]\n---\nname: c\negress:\n  - toCIDRSet:\n      - cidr: 0.0.0.0/0\n        except: [\"10.0.0.0/8\"]\n"))
	f.Add([]byte("name: [\n"))
	f.Add([]byte("name: x\nbogus: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := ParseFile("fuzz.yaml", data)
		if err != nil && !strings.Contains(err.Error(), "fuzz.yaml") {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}
