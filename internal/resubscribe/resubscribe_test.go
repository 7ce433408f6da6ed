// SPDX-License-Identifier: Apache-2.0

package resubscribe

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"
)

// degradedCount counts Degraded reports.
type degradedCount struct {
	cell.Health
	n int
}

func (h *degradedCount) Degraded(string, error) { h.n++ }

// TestRunRetriesUntilStopped: a failing follow is called again (after
// Min, the first time) and reported degraded each time; Run returns nil
// once ctx ends.
func TestRunRetriesUntilStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	health := &degradedCount{}
	calls := 0
	start := time.Now()
	err := Run(ctx, health, hivetest.Logger(t), "things", func(context.Context, cell.Health) (bool, error) {
		if calls++; calls == 3 {
			cancel()
		}
		return true, errors.New("subscription ended")
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls)
	require.Equal(t, 2, health.n, "each failure but the one that stopped is reported")
	require.GreaterOrEqual(t, time.Since(start), 2*Min, "a follow that listed waits Min again")
}
