// SPDX-License-Identifier: Apache-2.0

// Package privileged gates tests that need root: BPF maps and programs,
// bpffs mounts, TCX links, network namespaces.
package privileged

import (
	"os"
	"testing"
)

// Test skips the test with a message when not running as root, except
// under CI=true, where a privileged test must run: it fails instead.
func Test(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("privileged test cannot run: not root, and CI=true forbids skipping")
	}
	tb.Skip("privileged test: needs root (BPF, bpffs, TCX, network namespaces); skipped")
}
