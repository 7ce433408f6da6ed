// SPDX-License-Identifier: Apache-2.0

// Package netnstest is for tests that send traffic through network
// namespaces they create: entering a namespace, a TCP echo server, and a
// pinger that probes every millisecond and counts what comes back
// (zero-loss claims are made with it).
package netnstest

import (
	"errors"
	"testing"

	"github.com/ipcache-agent/ipcache-agent/internal/netnsrun"
)

// InNetns runs fn with the calling goroutine's thread in the named network
// namespace (one made by `ip netns add`), then moves the thread back (see
// netnsrun.Do); a thread that cannot be moved back fails the test.
//
// Possible errors: the namespace cannot be entered (it does not exist, or
// not as root); fn's error.
func InNetns(t testing.TB, ns string, fn func() error) error {
	t.Helper()
	err := netnsrun.Do(ns, fn)
	if errors.Is(err, netnsrun.ErrNotReturned) {
		t.Errorf("%v", err)
	}
	return err
}
