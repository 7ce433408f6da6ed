// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/ipcache-agent/ipcache-agent/internal/yamldir"
)

// watchTiming is how the directory job paces its reads (yamldir.Timing).
type watchTiming struct {
	debounce, maxDelay, resync time.Duration
	minRetry, maxRetry         time.Duration
}

func defaultWatchTiming() watchTiming {
	d := yamldir.DefaultTiming()
	return watchTiming{debounce: d.Debounce, maxDelay: d.MaxDelay, resync: d.Resync, minRetry: d.MinRetry, maxRetry: d.MaxRetry}
}

// watchDirectory reads the policy directory at start and whenever it
// changes, and periodically (yamldir.Dir.Watch). A directory that cannot
// be read, or a policy whose ipcache resource is taken, is retried with
// backoff; until the directory has been read once, the policy producer is
// not done, so nothing is pruned on its account.
func (l *loader) watchDirectory(ctx context.Context, health cell.Health, timing watchTiming) error {
	return policyDir(l.dir).Watch(ctx, l.log, yamldir.Timing{
		Debounce: timing.debounce, MaxDelay: timing.maxDelay, Resync: timing.resync,
		MinRetry: timing.minRetry, MaxRetry: timing.maxRetry,
	}, func(ctx context.Context) ([]string, bool, error) {
		dirs, err := l.load(ctx)
		l.reportHealth(health)
		// Some policy's resource is taken, or the policies in force could
		// not be saved: try again soon.
		return dirs, len(l.handleErrs) > 0 || l.saved.failed, err
	})
}
