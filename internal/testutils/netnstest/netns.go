// SPDX-License-Identifier: Apache-2.0

// Package netnstest is for tests that send traffic through network
// namespaces they create: entering a namespace, a TCP echo server, and a
// pinger that probes every millisecond and counts what comes back
// (zero-loss claims are made with it).
package netnstest

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// InNetns runs fn with the calling goroutine's thread in the named network
// namespace (one made by `ip netns add`), then moves the thread back.
// Sockets and netlink queries made by fn (including net.InterfaceByName
// and TCX attach by ifindex) see that namespace; a socket made there stays
// in it.
//
// Possible errors: the namespace cannot be entered (it does not exist, or
// not as root); fn's error.
func InNetns(t testing.TB, ns string, fn func() error) error {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", ns, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so the runtime ends it with the goroutine
		// rather than reusing a thread in the wrong namespace.
		t.Errorf("return from netns %s: %v", ns, err)
		return fnErr
	}
	runtime.UnlockOSThread()
	return fnErr
}
