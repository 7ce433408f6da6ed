// SPDX-License-Identifier: Apache-2.0

package metrics_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// TestWalkedSameKey: a key the value was computed for is not walked again.
func TestWalkedSameKey(t *testing.T) {
	var w metrics.Walked[uint64, int]
	walks := 0
	walk := func() int { walks++; return walks }
	require.Equal(t, 1, w.Get(7, walk))
	require.Equal(t, 1, w.Get(7, walk))
	require.Equal(t, 1, walks)
}

// TestWalkedCheap: a walk quicker than a millisecond is done again as soon
// as the key changes: a small table is never reported stale.
func TestWalkedCheap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w metrics.Walked[uint64, int]
		walks := 0
		walk := func() int { walks++; time.Sleep(500 * time.Microsecond); return walks }
		for key := range uint64(5) {
			require.Equal(t, int(key)+1, w.Get(key, walk))
		}
	})
}

// TestWalkedSpaced: after a walk of 10 ms, a changed key gets the kept
// value until 100 times that has passed since the walk began, then a new
// walk.
func TestWalkedSpaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w metrics.Walked[uint64, int]
		walks := 0
		walk := func() int { walks++; time.Sleep(10 * time.Millisecond); return walks }
		start := time.Now()
		require.Equal(t, 1, w.Get(1, walk))
		time.Sleep(time.Second - 20*time.Millisecond - time.Since(start))
		require.Equal(t, 1, w.Get(2, walk), "a second walk within 1 s of a 10 ms one")
		time.Sleep(time.Second - time.Since(start))
		require.Equal(t, 2, w.Get(2, walk), "walked again once 1 s has passed")
		require.Equal(t, 2, w.Get(2, walk), "and not again for the same key")
		require.Equal(t, 2, walks)
	})
}

// TestWalkedConcurrent: scrapes at once walk once, and see one value.
func TestWalkedConcurrent(t *testing.T) {
	var w metrics.Walked[uint64, int]
	var mu sync.Mutex
	walks := 0
	walk := func() int { mu.Lock(); defer mu.Unlock(); walks++; return 42 }
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { require.Equal(t, 42, w.Get(3, walk)) })
	}
	wg.Wait()
	require.Equal(t, 1, walks)
}
