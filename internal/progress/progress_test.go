// SPDX-License-Identifier: Apache-2.0

package progress

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWaitReturnsOnceReached(t *testing.T) {
	tr := New(0)
	done := make(chan int)
	go func() {
		v, err := tr.Wait(context.Background(), func(v int) bool { return v >= 3 })
		require.NoError(t, err)
		done <- v
	}()
	tr.Set(1)
	tr.Set(2)
	select {
	case v := <-done:
		t.Fatalf("returned at %d, before 3 was reached", v)
	case <-time.After(20 * time.Millisecond):
	}
	tr.Set(5)
	require.Equal(t, 5, <-done)
}

func TestWaitEndsWithTheContext(t *testing.T) {
	tr := New(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v, err := tr.Wait(ctx, func(v int) bool { return v >= 2 })
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, v)
	v, err = tr.Wait(ctx, func(v int) bool { return v >= 1 })
	require.NoError(t, err, "a value already reached needs no wait, even with a cancelled context")
	require.Equal(t, 1, v)
}
