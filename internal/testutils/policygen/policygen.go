// SPDX-License-Identifier: Apache-2.0

// Package policygen writes policy files for tests: files whose size and
// shape stand for what operators write, or for what a bug report saw;
// and the policies (as the model) of workloads that several benchmarks
// share, so that their figures are of the same work.
package policygen

import (
	"fmt"
	"strings"
)

// CIDRsTimesPorts returns a native policy file of one policy, name, with
// one egress rule (on line 3, column 5) of cidrs distinct /24s
// (10.a.b.0/24) and ranges port ranges {port: N, endPort: M}, without
// protocol (TCP and UDP). Each range is 1,000 ports wide, starting one
// port past a multiple of 1,000, so that it needs about 10 aligned blocks:
// the policy computes cidrs × ranges × 2 × about 10 policy map entries.
// With 1,000 CIDRs and 40 ranges it is 18 KB and computes 872,000 entries,
// as the file that, expanded whole, exhausted the agent did (docs/FAULTS.md).
func CIDRsTimesPorts(name string, cidrs, ranges int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\negress:\n  - toCIDR: [", name)
	for i := range cidrs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
	}
	b.WriteString("]\n    toPorts: [")
	for i := range ranges {
		if i > 0 {
			b.WriteString(", ")
		}
		start := 1001 + 1000*i
		fmt.Fprintf(&b, "{port: %d, endPort: %d}", start, start+999)
	}
	b.WriteString("]\n")
	return []byte(b.String())
}
