// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
)

// The prefix lengths -lengths=mixed cycles through, per family.
var (
	mixedV4Lengths = []int{32, 31, 30, 29, 28, 27, 26, 24}
	mixedV6Lengths = []int{128, 124, 120, 112, 96, 64, 56, 48}
)

// policyPrefixes is the client's allow list: n prefixes of the family
// (ipv4, ipv6, or mixed: every other one IPv6), /32 and /128 only or of
// mixed lengths, the server's allowed address(es) last among them. The
// generated prefixes neither overlap nor touch (a gap of one block after
// each, so nft keeps each as an interval of its own) and stay clear of the
// namespaces' addresses.
func policyPrefixes(n int, family string, mixedLengths bool) []netip.Prefix {
	var tail []netip.Prefix
	if family != "ipv6" {
		tail = append(tail, netip.PrefixFrom(netip.MustParseAddr(serverV4.allowed), 32))
	}
	if family != "ipv4" {
		tail = append(tail, netip.PrefixFrom(netip.MustParseAddr(serverV6.allowed), 128))
	}
	out := make([]netip.Prefix, 0, max(n, len(tail)))
	v4 := uint64(20 << 24)                      // 20.0.0.0 on
	v6hi, v6lo := uint64(0x3fff<<48), uint64(0) // 3fff:: on
	for i := 0; len(out) < n-len(tail); i++ {
		six := family == "ipv6" || (family == "mixed" && i%2 == 1)
		if !six {
			bits := 32
			if mixedLengths {
				bits = mixedV4Lengths[(i/2)%len(mixedV4Lengths)]
			}
			block := uint64(1) << (32 - bits)
			v4 = (v4 + block - 1) &^ (block - 1)
			var a [4]byte
			binary.BigEndian.PutUint32(a[:], uint32(v4))
			out = append(out, netip.PrefixFrom(netip.AddrFrom4(a), bits))
			v4 += 2 * block
			continue
		}
		bits := 128
		if mixedLengths {
			bits = mixedV6Lengths[(i/2)%len(mixedV6Lengths)]
		}
		var block uint64
		if bits > 64 {
			block = uint64(1) << (128 - bits)
			v6lo = (v6lo + block - 1) &^ (block - 1)
		} else {
			// A /64 or shorter starts a new high half.
			if v6lo != 0 {
				v6hi, v6lo = v6hi+1, 0
			}
			block = uint64(1) << (64 - bits)
			v6hi = (v6hi + block - 1) &^ (block - 1)
		}
		var a [16]byte
		binary.BigEndian.PutUint64(a[:8], v6hi)
		binary.BigEndian.PutUint64(a[8:], v6lo)
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(a), bits))
		if bits > 64 {
			if v6lo += 2 * block; v6lo == 0 { // wrapped: on to the next high half
				v6hi++
			}
		} else {
			v6hi += 2 * block
		}
	}
	return append(out, tail...)
}

// agentFileSize is the prefixes per agent policy file: a file is at most
// 4 MiB (docs/CONTRACT.md), 100,000 CIDRs are about 2.5 MB.
const agentFileSize = 100_000

// writeAgentPolicies writes the prefixes as native policy files of one
// egress toCIDR rule each into dir, and returns how many files.
//
// Possible errors: writing the files.
func writeAgentPolicies(dir string, prefixes []netip.Prefix) (int, error) {
	files := 0
	for start := 0; start < len(prefixes); start += agentFileSize {
		chunk := prefixes[start:min(start+agentFileSize, len(prefixes))]
		if err := writeAgentPolicy(dir, fmt.Sprintf("bpeer-%03d", files), chunk); err != nil {
			return files, err
		}
		files++
	}
	return files, nil
}

// writeAgentPolicy writes one policy file named name.yaml, atomically (a
// hidden name the agent ignores, then renamed).
//
// Possible errors: writing the file.
func writeAgentPolicy(dir, name string, prefixes []netip.Prefix) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "name: %s\negress:\n  - toCIDR:\n", name)
	for _, p := range prefixes {
		fmt.Fprintf(w, "      - %q\n", p.String())
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name+".yaml"))
}

// nftTable is the table's name in the router namespace.
const nftTable = "bpeer"

// writeNftRuleset writes the ruleset a careful administrator loads with
// `nft -f`: an inet table with an interval set per family, and in the
// forward hook, for what comes from the client's device: established and
// related connections accepted first, then what goes to the sets, then
// the rest dropped.
//
// Possible errors: writing the file.
func writeNftRuleset(path string, prefixes []netip.Prefix) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "table inet %s {\n", nftTable)
	for _, set := range []struct {
		name, typ string
		six       bool
	}{{"allow4", "ipv4_addr", false}, {"allow6", "ipv6_addr", true}} {
		fmt.Fprintf(w, "\tset %s {\n\t\ttype %s\n\t\tflags interval\n", set.name, set.typ)
		first := true
		for _, p := range prefixes {
			if p.Addr().Is6() != set.six {
				continue
			}
			if first {
				fmt.Fprint(w, "\t\telements = {\n")
				first = false
			}
			fmt.Fprintf(w, "\t\t\t%s,\n", p)
		}
		if !first {
			fmt.Fprint(w, "\t\t}\n")
		}
		fmt.Fprint(w, "\t}\n")
	}
	fmt.Fprintf(w, `	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname %q ct state established,related accept
		iifname %q ip daddr @allow4 accept
		iifname %q ip6 daddr @allow6 accept
		iifname %q drop
	}
}
`, routerClientDev, routerClientDev, routerClientDev, routerClientDev)
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
