// SPDX-License-Identifier: Apache-2.0

// Package privileged gates tests that need root: BPF maps and programs,
// bpffs mounts, TCX links, network namespaces.
package privileged

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
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

// MountBPFFS mounts a bpffs of the test's own at dir (created if needed),
// unmounted when the test ends. A test whose agent runs under `ip netns
// exec` (netnstest) mounts it itself: the agent mounts no bpffs from a
// mount namespace other than the host's, and a test's pins need not
// outlive the test.
//
// Possible errors: dir cannot be created; mount(2)'s (not root).
func MountBPFFS(tb testing.TB, dir string) error {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	tb.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return nil
}
