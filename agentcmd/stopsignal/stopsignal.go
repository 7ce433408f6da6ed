// SPDX-License-Identifier: Apache-2.0

// Package stopsignal catches SIGTERM and SIGINT, and keeps SIGHUP and
// SIGPIPE from killing the process, from its first moments: an agent
// stopped a few milliseconds after it was started exits cleanly instead of
// being killed by the signal, a hangup does not stop it, and a closed
// stdout or stderr makes its writes fail (EPIPE) instead of killing it.
//
// This is done in the package's init, the one place that runs before the
// package initialization of the agent's dependencies (which alone takes
// milliseconds): Go initializes a package as soon as its imports are, and
// this one imports only os/signal. Any binary that links agentcmd gets it;
// a command that is not the agent calls [Release]. What is left is the Go
// runtime's own start, before any package is initialized: a signal then
// has its default effect in any Go program.
//
// SIGHUP is ignored (SIG_IGN), set last: /proc/<pid>/status shows it in
// SigIgn once all of the above is in place. Go cannot undo that (Release
// leaves it), and processes the agent starts would inherit it; it starts
// none.
package stopsignal

import (
	"os"
	"os/signal"
	"syscall"
)

// The signal disposition is the process's, and init, which has to set it
// up, has nowhere else to keep the channels.
var (
	// caught holds a SIGTERM or SIGINT until the agent reads it.
	caught = make(chan os.Signal, 1)
	// discarded is never read: being notified is what keeps the runtime
	// from dying of a SIGPIPE from a write to stdout or stderr.
	discarded = make(chan os.Signal, 1)
)

func init() {
	signal.Notify(caught, syscall.SIGTERM, syscall.SIGINT)
	signal.Notify(discarded, syscall.SIGPIPE)
	signal.Ignore(syscall.SIGHUP)
}

// Caught returns the channel SIGTERM and SIGINT arrive on, one that arrived
// before anyone read it included.
func Caught() <-chan os.Signal { return caught }

// Release gives SIGTERM, SIGINT and SIGPIPE their default behaviour back,
// for a command that is not the agent: a shell client stops at Ctrl-C and
// dies of SIGPIPE when its reader goes away. A SIGTERM or SIGINT caught so
// far is raised again, so that it has its default effect now. SIGHUP stays
// ignored (see the package documentation).
func Release() {
	signal.Reset(syscall.SIGTERM, syscall.SIGINT, syscall.SIGPIPE)
	select {
	case sig := <-caught:
		syscall.Kill(os.Getpid(), sig.(syscall.Signal))
	default:
	}
}
