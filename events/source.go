// SPDX-License-Identifier: Apache-2.0

package events

import "github.com/cilium/ebpf"

// Source is the loaded enforcement program's event output, as the datapath
// hands it to the monitor: the datapath loads the program in its start
// hook and closes it in its stop hook, so a reader that starts after the
// datapath and stops before it (a hive lifecycle hook of a cell that
// depends on the Source) never reads a closed program.
type Source interface {
	// Ring returns the program's ring buffer of events (struct event
	// records, see Decode).
	//
	// Possible errors: ErrNoProgram.
	Ring() (*ebpf.Map, error)

	// SetMask sets which events the program writes (its events_mask);
	// 0 makes it write none.
	//
	// Possible errors: ErrNoProgram; the program's variable cannot be
	// written.
	SetMask(Kinds) error

	// Lost returns the events the program could not write since it was
	// loaded: refused by the rate limit, and by a full ring buffer, summed
	// over CPUs.
	//
	// Possible errors: ErrNoProgram; the program's event_state map cannot
	// be read.
	Lost() (rateLimited, ringFull uint64, err error)
}
