// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"net/netip"
	"testing"
)

// BenchmarkResolveQueue queues a million prefixes in one lane, in address
// order as a batch's changes come, and takes them in chunks.
func BenchmarkResolveQueue(b *testing.B) {
	const n = 1 << 20
	prefixes := make([]netip.Prefix, n)
	for i := range prefixes {
		prefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
	}
	b.ReportAllocs()
	for b.Loop() {
		var q resolveQueue
		for i, p := range prefixes {
			q.add("owner", p, uint64(i))
		}
		for len(q.next(4096)) > 0 {
		}
	}
}
