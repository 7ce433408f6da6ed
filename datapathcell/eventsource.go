// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/ipcache-agent/ipcache-agent/events"
)

// programEvents is the loaded program's event output, which the monitor
// cell reads (events.Source): the ring buffer, the events_mask and the
// per-CPU event_state of the program the datapath loaded at start.
type programEvents struct{ d *Datapath }

var _ events.Source = programEvents{}

func newProgramEvents(d *Datapath) events.Source { return programEvents{d} }

// loaded is the program the datapath loaded.
//
// Possible errors: events.ErrNoProgram.
func (p programEvents) loaded() (*enforcer, error) {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	if p.d.enforcer == nil {
		return nil, events.ErrNoProgram
	}
	return p.d.enforcer, nil
}

// Ring implements events.Source.
func (p programEvents) Ring() (*ebpf.Map, error) {
	enf, err := p.loaded()
	if err != nil {
		return nil, err
	}
	return enf.events, nil
}

// SetMask implements events.Source.
func (p programEvents) SetMask(kinds events.Kinds) error {
	enf, err := p.loaded()
	if err != nil {
		return err
	}
	if err := enf.eventsMask.Set(uint32(kinds)); err != nil {
		return fmt.Errorf("set events mask: %w", err)
	}
	return nil
}

// Lost implements events.Source.
func (p programEvents) Lost() (rateLimited, ringFull uint64, err error) {
	enf, err := p.loaded()
	if err != nil {
		return 0, 0, err
	}
	var perCPU [][4]uint64
	if err := enf.eventState.Lookup(uint32(0), &perCPU); err != nil {
		return 0, 0, fmt.Errorf("read event_state: %w", err)
	}
	for _, s := range perCPU {
		rateLimited += s[2]
		ringFull += s[3]
	}
	return rateLimited, ringFull, nil
}
