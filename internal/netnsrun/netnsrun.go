// SPDX-License-Identifier: Apache-2.0

package netnsrun

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn with the calling goroutine's thread in the named network
// namespace, then moves the thread back. Sockets and netlink queries made
// by fn (including net.InterfaceByName and TCX attach by ifindex) see that
// namespace; a socket made there stays in it.
//
// Possible errors: the namespace cannot be entered (it does not exist, or
// not as root); fn's error; ErrNotReturned (joined with fn's).
func Do(ns string, fn func() error) error {
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
		return errors.Join(fnErr, fmt.Errorf("%w %s: %w", ErrNotReturned, ns, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}
