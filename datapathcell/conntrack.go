// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
)

// The conntrack maps are the conntrack cell's to collect and list
// (conntrackcell); the datapath opens them, loads the program over them
// and hands them over as a bpfmaps.ConntrackMaps.

// setConntrackTimeouts writes t into the program's timeout constants; a
// zero t leaves the declared defaults.
func setConntrackTimeouts(spec *ebpf.CollectionSpec, t bpfmaps.ConntrackTimeouts) error {
	if t == (bpfmaps.ConntrackTimeouts{}) {
		return nil
	}
	for name, d := range map[string]time.Duration{
		bpf.EnforceVarCtTimeoutTcpOpening:     t.TCPOpening,
		bpf.EnforceVarCtTimeoutTcpEstablished: t.TCPEstablished,
		bpf.EnforceVarCtTimeoutTcpClosing:     t.TCPClosing,
		bpf.EnforceVarCtTimeoutOther:          t.Other,
	} {
		v, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("set conntrack timeouts: program has no variable %s", name)
		}
		if err := v.Set(uint64(d)); err != nil {
			return fmt.Errorf("set conntrack timeout %s: %w", name, err)
		}
	}
	return nil
}

// conntrackMaps is the Datapath as the conntrack cell sees it.
type conntrackMaps struct{ d *Datapath }

var _ bpfmaps.ConntrackMaps = conntrackMaps{}

func newConntrackMaps(d *Datapath) bpfmaps.ConntrackMaps { return conntrackMaps{d} }

// sharedMap returns the datapath's own handle of the pinned map that which
// picks (unlike pinnedMap, no duplicate: for the collector's rounds,
// which stop with the maps), nil while the maps are not open.
func (d *Datapath) sharedMap(which func(*bpfmaps.Pinned) *ebpf.Map) *ebpf.Map {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.maps == nil {
		return nil
	}
	return which(d.maps)
}

// Conntrack implements bpfmaps.ConntrackMaps.
func (c conntrackMaps) Conntrack() *ebpf.Map {
	return c.d.sharedMap(func(m *bpfmaps.Pinned) *ebpf.Map { return m.Conntrack })
}

// ConntrackOpening implements bpfmaps.ConntrackMaps.
func (c conntrackMaps) ConntrackOpening() *ebpf.Map {
	return c.d.sharedMap(func(m *bpfmaps.Pinned) *ebpf.Map { return m.ConntrackOpening })
}

// ConntrackFull implements bpfmaps.ConntrackMaps.
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when the program's ct_stats cannot be read.
func (c conntrackMaps) ConntrackFull() (uint64, error) {
	d := c.d
	d.mu.Lock()
	enf := d.enforcer
	d.mu.Unlock()
	if enf == nil {
		return 0, fmt.Errorf("read ct_stats: %w", ErrMapsNotOpen)
	}
	return enf.conntrackFull()
}

// ConntrackDeleted implements bpfmaps.ConntrackMaps: a bump of the
// revision, which every connection the program keeps is kept at.
func (c conntrackMaps) ConntrackDeleted() {
	d := c.d
	d.mu.Lock()
	revision := d.revision
	d.mu.Unlock()
	revision.bump()
}

// conntrackFull sums the program's per-CPU count of failed moves to a
// full conntrack map.
//
// Possible errors: the kernel's, when ct_stats cannot be read.
func (e *enforcer) conntrackFull() (uint64, error) {
	var perCPU []uint64
	if err := e.ctStats.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read ct_stats: %w", err)
	}
	var total uint64
	for _, n := range perCPU {
		total += n
	}
	return total, nil
}
