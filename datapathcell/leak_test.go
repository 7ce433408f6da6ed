// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/parallel"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// hive the tests start must stop everything it started (jobs, watchers,
// reconcilers, timers).
func TestMain(m *testing.M) {
	parallel.AtLeast(minParallel)
	goleak.VerifyTestMain(m)
}

// minParallel is how many tests of this package run at once unless
// -test.parallel says otherwise. Every test is parallel but those that
// time the kernel or the agent (see each), and most of their time is
// waiting (pings, timeouts of denied probes, namespaces, agents in child
// processes) rather than the CPU, so the default (GOMAXPROCS, two cores
// in CI) leaves the machine idle.
const minParallel = 4
