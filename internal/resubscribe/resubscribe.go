// SPDX-License-Identifier: Apache-2.0

// Package resubscribe runs a follower of kernel state (a netlink
// subscription and a listing) again each time its subscription fails,
// with backoff: the cells that follow links and addresses share it.
package resubscribe

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
)

// The wait before a follower subscribes and lists again after its
// subscription failed: Min, then twice as long each time, up to Max; a
// follow that listed starts over from Min.
const (
	Min = 100 * time.Millisecond
	Max = 10 * time.Second
)

// Follow is one subscription: it subscribes, lists, and applies updates
// until the subscription fails or ctx ends. It reports whether it listed
// (the state was read whole), and why it ended.
type Follow func(ctx context.Context, health cell.Health) (listed bool, err error)

// Run calls follow until ctx ends. After each failure it logs, reports
// health degraded ("Following <what> failed") and waits before the next.
// It returns nil: a stopping context is no error.
func Run(ctx context.Context, health cell.Health, log *slog.Logger, what string, follow Follow) error {
	wait := Min
	for {
		listed, err := follow(ctx, health)
		if ctx.Err() != nil {
			return nil
		}
		if listed {
			wait = Min
		}
		log.Warn("Following "+what+" failed; listing them again", "error", err, "retry-in", wait)
		health.Degraded("Following "+what+" failed", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, Max)
	}
}
