package ipcachecell

import (
	"fmt"
	"net/netip"
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
	require.Equal(t, hostPrefixes(0, 100), first, "a lone group is taken in address order")

	single := netip.MustParsePrefix("192.0.2.1/32")
	q.add([]netip.Prefix{single})
	chunk := q.next(100)
	require.Equal(t, single, chunk[0], "the newest change goes first")
	require.Equal(t, hostPrefixes(100, 99), chunk[1:], "the rest of the chunk is the oldest backlog")

	q.add(hostPrefixes(50_000, 1000))
	chunk = q.next(100)
	require.Equal(t, hostPrefixes(50_000, 50), chunk[:50], "at most half a chunk from the newest group")
	require.Equal(t, hostPrefixes(199, 50), chunk[50:], "the backlog progresses")
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
