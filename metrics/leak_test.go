// SPDX-License-Identifier: Apache-2.0

package metrics_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// hive the tests start must stop everything it started (jobs, watchers,
// reconcilers, timers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
