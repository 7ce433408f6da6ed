package ipcachecell

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func hostPrefixes(first, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		out[i] = netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.%d/32", (first+i)>>16&0xff, (first+i)>>8&0xff, (first+i)&0xff))
	}
	return out
}

// A small change that arrives behind a large backlog is resolved in the
// next chunk, and the backlog still progresses in every chunk.
func TestResolveQueueNewChangesDoNotWaitForTheBacklog(t *testing.T) {
	var q resolveQueue
	q.add(hostPrefixes(0, 10_000))
	first := q.next(100)
	require.Equal(t, hostPrefixes(0, 100), first, "a lone group is taken from its start")

	// The newest change comes last in a large arrival (a release chunk
	// committed just before it): it still goes in the next chunk.
	single := netip.MustParsePrefix("192.0.2.1/32")
	q.add(append(hostPrefixes(20_000, 1000), single))
	chunk := q.next(100)
	require.Contains(t, chunk, single, "the newest change goes first")
	require.Subset(t, chunk, hostPrefixes(100, 50), "the rest of the chunk is the oldest backlog")
	require.Subset(t, chunk, hostPrefixes(20_951, 49), "half of the chunk is the newest changes")
	require.True(t, slices.IsSortedFunc(chunk, comparePrefixes), "a chunk is in address order")
}

// A prefix queued twice is resolved once; after it is taken, it can be
// queued again (it changed again).
func TestResolveQueueDeduplicates(t *testing.T) {
	var q resolveQueue
	p := netip.MustParsePrefix("10.0.0.1/32")
	q.add([]netip.Prefix{p, p})
	q.add([]netip.Prefix{p})
	require.Equal(t, []netip.Prefix{p}, q.next(10))
	require.Empty(t, q.next(10))
	q.add([]netip.Prefix{p})
	require.Equal(t, []netip.Prefix{p}, q.next(10))
}
