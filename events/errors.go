// SPDX-License-Identifier: Apache-2.0

package events

import "errors"

var (
	// ErrNoProgram is returned by what reads the enforcement program's
	// events (a Source, and the monitor through it) when the agent loaded
	// none: no --devices, or before start and after stop.
	ErrNoProgram = errors.New("no enforcement program loaded (no --devices?)")

	// errShortEvent is Decode's error for a record shorter than the
	// program's struct event.
	errShortEvent = errors.New("event shorter than the program's struct event")
)
