// SPDX-License-Identifier: Apache-2.0

package cells

import "errors"

// ErrOwned is returned when another running agent owns the state directory
// or the pins under the bpffs root (see [AcquireOwner]).
var ErrOwned = errors.New("owned by another running agent")

// ErrNoAgent is returned by [ShellExchange] when no agent listens on the
// shell socket.
var ErrNoAgent = errors.New("no agent is listening")

// ErrShellBusy is the error of a shell command, or client, beyond what the
// shell serves at once: try again later.
var ErrShellBusy = errors.New("shell busy")

// ErrNotHealthy is the error of the shell's `health` when a scope is
// degraded or stopped, or when no row matched its pattern in time.
var ErrNotHealthy = errors.New("not healthy")

// ErrShellCommandsFailed is returned by [ShellScript] when some of its
// commands failed (each error was printed).
var ErrShellCommandsFailed = errors.New("shell commands failed")
