// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import "errors"

var (
	// ErrMapFull is the collector's error (the conntrack-gc job's health
	// is Degraded) while connections that became established could not
	// move to the full conntrack map: they stay in ct_opening, where a
	// flood of new connections can evict them.
	ErrMapFull = errors.New("the conntrack map is full")

	// ErrMapsNotOpen is returned by Tracker.List and Tracker.Flush before
	// the datapath has opened the pinned maps at start or after it closed
	// them at stop.
	ErrMapsNotOpen = errors.New("pinned maps are not open")
)
