// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

// Tracker collects and reads the conntrack and ct_opening maps that the
// datapath opened (bpfmaps.ConntrackMaps).
type Tracker struct {
	maps bpfmaps.ConntrackMaps
	// established and opening collect conntrack and ct_opening.
	established, opening *collector
}

func newTracker(maps bpfmaps.ConntrackMaps, log *slog.Logger) *Tracker {
	return &Tracker{maps: maps,
		established: newCollector(maps.Conntrack, log), opening: newCollector(maps.ConntrackOpening, log)}
}

// Entry is a conntrack map entry, decoded.
type Entry struct {
	Endpoint, Remote netip.AddrPort
	Protocol         uint8
	// Ifindex is the device the connection was seen on.
	Ifindex uint32
	// Opening: the entry is in ct_opening (its origin has not spoken
	// after a reply yet).
	Opening bool
	// Origin is the direction that opened the connection.
	Origin uint8
	Flags  uint8
	// Expires is the CLOCK_MONOTONIC_COARSE time after which the entry is dead.
	Expires time.Duration
}

// Stats returns the collector's counts and the map's size, of conntrack
// (established connections) and of ct_opening.
func (t *Tracker) Stats() (established, opening Stats) {
	var maxEntries, openingMax uint32
	if m := t.maps.Conntrack(); m != nil {
		maxEntries = m.MaxEntries()
	}
	if m := t.maps.ConntrackOpening(); m != nil {
		openingMax = m.MaxEntries()
	}
	return t.established.stats(maxEntries), t.opening.stats(openingMax)
}

// Full counts the connections the program could not move to the conntrack
// map because it was full, summed over CPUs, since the program was loaded
// (they stay in ct_opening, where a flood of new connections can evict
// them).
//
// Possible errors: no program is loaded (before start, after stop, no
// --devices: the datapath's error); the kernel's error when the program's
// ct_stats cannot be read.
func (t *Tracker) Full() (uint64, error) {
	return t.maps.ConntrackFull()
}

// List returns the entries of the conntrack maps, expired ones included
// (until collected), and the CLOCK_MONOTONIC_COARSE time they were read
// at, to compare Expires with.
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when a map cannot be read.
func (t *Tracker) List() ([]Entry, time.Duration, error) {
	established, opening := t.maps.Conntrack(), t.maps.ConntrackOpening()
	if established == nil || opening == nil {
		return nil, 0, fmt.Errorf("read conntrack map: %w", ErrMapsNotOpen)
	}
	now := bpfmaps.MonotonicNow()
	var out []Entry
	for _, m := range []*ebpf.Map{established, opening} {
		var k bpfmaps.ConntrackKey
		var v bpfmaps.ConntrackValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			endpoint, remote, protocol, err := k.Fields()
			if err != nil {
				continue // not the program's: skip it
			}
			out = append(out, Entry{Endpoint: endpoint, Remote: remote, Protocol: protocol,
				Ifindex: binary.NativeEndian.Uint32(k[40:44]), Opening: m == opening,
				Origin: v.Origin(), Flags: v.Flags(), Expires: v.Expires()})
		}
		if err := it.Err(); err != nil {
			return nil, 0, fmt.Errorf("read conntrack map %s: %w", m, err)
		}
	}
	return out, now, nil
}

// Flush deletes every entry of both maps and returns how many it deleted.
// Replies of the flushed connections are then decided by policy until
// their next forward packet recreates the entry.
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when a map cannot be read or an entry deleted.
func (t *Tracker) Flush() (int, error) {
	established, opening := t.maps.Conntrack(), t.maps.ConntrackOpening()
	if established == nil || opening == nil {
		return 0, fmt.Errorf("flush conntrack map: %w", ErrMapsNotOpen)
	}
	// Also after a failure: what was deleted is gone.
	defer t.maps.ConntrackDeleted()
	total := 0
	for _, m := range []*ebpf.Map{established, opening} {
		var keys []bpfmaps.ConntrackKey
		var k bpfmaps.ConntrackKey
		var v bpfmaps.ConntrackValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			return total, fmt.Errorf("flush conntrack map: %w", err)
		}
		deleted, err := deleteKeys(m, keys)
		total += deleted
		if err != nil {
			return total, fmt.Errorf("flush conntrack map: %w", err)
		}
	}
	return total, nil
}
