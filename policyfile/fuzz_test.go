// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// FuzzParse: the policy parser never panics, an error always names
// the file and is ErrInvalidPolicy, every prefix of an accepted policy
// is one the ipcache can key (see checkPolicyPrefix).
func FuzzParse(f *testing.F) {
	f.Add([]byte("name: a\negress:\n  - toCIDR: [\"10.0.0.0/8\"]\n    toPorts: [{port: 53, protocol: UDP}]\n"))
	f.Add([]byte("name: b\ningress:\n  - fromCIDR: [\"2001:db8::/32\"]\n---\nname: c\negress:\n  - toCIDRSet:\n      - cidr: 0.0.0.0/0\n        except: [\"10.0.0.0/8\"]\n"))
	f.Add([]byte("name: e\negressDeny:\n  - toPorts: [{port: 80, endPort: 90, protocol: TCP}]\ningress:\n  - icmps: [{fields: [{type: 8}]}]\nenableDefaultDeny: {ingress: false}\n"))
	f.Add([]byte("name: f\negress:\n  - toEndpoints: [{matchLabels: {app: a}}]\n  - toEntities: [host, world]\n    toPorts: [{port: 80}]\n"))
	f.Add([]byte("name: g\negress:\n  - toFQDNs: [{matchName: a.example.}, {matchPattern: \"*\"}]\n    toPorts: [{port: 443}]\n  - toPorts: [{port: 53, protocol: UDP, rules: {dns: [{matchPattern: \"*.a\"}]}}]\n"))
	f.Add([]byte("name: [\n"))
	f.Add([]byte("name: x\nbogus: 1\n"))
	f.Add([]byte("name: d\negress:\n  - toCIDR: [\"192.0.2.1\", \"::ffff:10.0.0.0/104\", \"fe80::1%eth0\"]\n"))
	f.Add([]byte("{a, b: c, \"d: e\"}\n---\n? x\n: [y: , -1]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		policies, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") || !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("error does not name the file or is not ErrInvalidPolicy: %v", err)
			}
			return
		}
		for _, p := range policies {
			for _, dir := range policy.Directions() {
				for _, rule := range p.Rules(dir) {
					checkFQDNRule(t, p.Name, dir, rule)
					for _, peer := range rule.Peers {
						checkPolicyPrefix(t, peer.CIDR)
						for _, except := range peer.Except {
							checkPolicyPrefix(t, except)
							if !prefixkey.Inside(peer.CIDR, except) {
								t.Fatalf("policy %q: except %s is not inside %s", p.Name, except, peer.CIDR)
							}
						}
					}
				}
			}
		}
	})
}

// FuzzParseCIDR: a CIDR as a user writes it in a policy file (toCIDR,
// fromCIDR, cidr, except). Whatever is accepted is a valid, masked prefix
// without zone, not IPv4-mapped, whose canonical text is accepted as the
// same prefix and whose cidr label parses back to it; an error names the
// file and the field.
func FuzzParseCIDR(f *testing.F) {
	for _, seed := range []string{"10.0.0.0/8", "10.0.0.1/8", "192.0.2.1", "0.0.0.0/0", "::/0", "2001:db8::/32",
		"2001:DB8::/32", "::ffff:10.0.0.0/104", "::ffff:10.0.0.1", "fe80::1%eth0", "fe80::%eth0/64",
		"10.0.0.0/33", "10.0.0.0/08", "1.2.3.4/", "", " 10.0.0.0/8", "10.0.0.0/8 "} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // not a value a YAML file can have
		}
		p := &parser{file: "fuzz.yaml", names: map[string]int{}}
		node := scalarAt(t, s, "\n\n      ") // at 3:7
		prefix, err := p.cidr(node, "egress[0].toCIDR", 0)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "fuzz.yaml:3:7: ") || !strings.Contains(msg, "toCIDR[0]") {
				t.Fatalf("error does not name the file, position and field: %v", err)
			}
			return
		}
		checkPolicyPrefix(t, prefix)
		again, err := p.cidr(scalarAt(t, prefix.String(), ""), "again", -1)
		if err != nil || again != prefix {
			t.Fatalf("%q parses to %s, whose text parses to %s, %v", s, prefix, again, err)
		}
		if !strings.Contains(s, "/") {
			if addr, err := netip.ParseAddr(s); err != nil || prefix != netip.PrefixFrom(addr, addr.BitLen()) {
				t.Fatalf("bare address %q parses to %s, want its host prefix", s, prefix)
			}
		}
	})
}

// scalarAt reads a document of one double-quoted scalar of value s after
// before.
func scalarAt(t *testing.T, s, before string) node {
	var b strings.Builder
	b.WriteString(before + `"`)
	for _, c := range s {
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			b.WriteRune(c)
		} else {
			fmt.Fprintf(&b, `\U%08x`, c)
		}
	}
	b.WriteString(`"`)
	n, err := newDocumentReader([]byte(b.String()), 10).next()
	if err != nil || n.Value() != s {
		t.Fatalf("%q: read %q, %v", b.String(), n.Value(), err)
	}
	return n
}

// checkPolicyPrefix fails unless prefix is one the ipcache keys as the
// policy means it: valid, masked, no zone, IPv4 as IPv4, and with a cidr
// label that names exactly it.
func checkPolicyPrefix(t *testing.T, prefix netip.Prefix) {
	t.Helper()
	switch {
	case !prefix.IsValid():
		t.Fatalf("invalid prefix %s accepted", prefix)
	case prefix != prefix.Masked():
		t.Fatalf("prefix %s with host bits accepted", prefix)
	case prefix.Addr().Zone() != "":
		t.Fatalf("prefix %s with a zone accepted", prefix)
	case prefix.Addr().Is4In6():
		t.Fatalf("IPv4-mapped prefix %s accepted", prefix)
	}
	l, err := labels.Parse(labels.ForPrefix(prefix).String())
	if named := slices.Collect(l.Prefixes()); err != nil || !slices.Equal(named, []netip.Prefix{prefix}) {
		t.Fatalf("prefix %s: label %q names %v, %v", prefix, labels.ForPrefix(prefix), named, err)
	}
}
