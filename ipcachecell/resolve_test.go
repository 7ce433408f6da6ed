// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

func hostPrefixes(first, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		out[i] = netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.%d/32", (first+i)>>16&0xff, (first+i)>>8&0xff, (first+i)&0xff))
	}
	return out
}

func addAll(q *resolveQueue, resource string, prefixes []netip.Prefix) {
	for _, p := range prefixes {
		q.add(resource, p)
	}
}

// Another owner's single change, queued behind a large release, is in the
// next chunk; the release still progresses in every chunk.
func TestResolveQueueSharesChunksAmongOwners(t *testing.T) {
	var q resolveQueue
	addAll(&q, "restore", hostPrefixes(0, 10_000))
	require.Equal(t, hostPrefixes(0, 100), q.next(100), "a lone lane is first in, first out")

	single := netip.MustParsePrefix("192.0.2.1/32")
	q.add("policy/a", single)
	addAll(&q, "restore", hostPrefixes(20_000, 1000)) // committed after it
	chunk := q.next(100)
	require.Contains(t, chunk, single)
	require.Subset(t, chunk, hostPrefixes(100, 99), "the rest of the chunk is the release, in order")
	require.True(t, slices.IsSortedFunc(chunk, prefixkey.Compare), "a chunk is in address order")

	addAll(&q, "policy/b", hostPrefixes(50_000, 1000))
	chunk = q.next(100)
	require.Subset(t, chunk, hostPrefixes(199, 50), "two busy owners share a chunk")
	require.Subset(t, chunk, hostPrefixes(50_000, 50))
}

// A prefix queued twice (by one owner or two) is resolved once; after it
// is taken, it can be queued again (it changed again).
func TestResolveQueueDeduplicates(t *testing.T) {
	var q resolveQueue
	p := netip.MustParsePrefix("10.0.0.1/32")
	q.add("a", p)
	q.add("a", p)
	q.add("b", p)
	require.Equal(t, []netip.Prefix{p}, q.next(10))
	require.Empty(t, q.next(10))
	q.add("b", p)
	require.Equal(t, []netip.Prefix{p}, q.next(10))
}
