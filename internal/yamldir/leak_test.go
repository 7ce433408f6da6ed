// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: Watch
// must stop its watcher when its context ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
