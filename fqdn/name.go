// SPDX-License-Identifier: Apache-2.0

package fqdn

import "net/netip"

// nameEntries are a name's pairs: the live ones first, then the deferred
// ones, so that a name at its cap looks for the soonest to expire among
// its live pairs only; and, once it has many, an index by address, so
// that learning an address of a name that rotates many (as S3's do) reads
// no list.
type nameEntries struct {
	entries []*entry // [0, live) live, [live, len) deferred
	live    int
	byAddr  map[netip.Addr]*entry // once there are more than indexFrom
}

// indexFrom is the number of pairs a name has before it indexes them:
// below it, a look through the list is as fast as a map.
const indexFrom = 16

func (ne *nameEntries) find(addr netip.Addr) *entry {
	if ne == nil {
		return nil
	}
	if ne.byAddr != nil {
		return ne.byAddr[addr]
	}
	for _, e := range ne.entries {
		if e.addr == addr {
			return e
		}
	}
	return nil
}

// add adds e, live or deferred as e says.
func (ne *nameEntries) add(e *entry) {
	e.slot = int32(len(ne.entries))
	ne.entries = append(ne.entries, e)
	if !e.deferred {
		ne.move(e, ne.live)
		ne.live++
	}
	switch {
	case ne.byAddr != nil:
		ne.byAddr[e.addr] = e
	case len(ne.entries) > indexFrom:
		ne.byAddr = make(map[netip.Addr]*entry, len(ne.entries))
		for _, held := range ne.entries {
			ne.byAddr[held.addr] = held
		}
	}
}

// setDeferred moves a live e to the deferred ones; the caller sets
// e.deferred.
func (ne *nameEntries) setDeferred(e *entry) {
	ne.live--
	ne.move(e, ne.live)
}

// setLive moves a deferred e to the live ones; the caller clears
// e.deferred.
func (ne *nameEntries) setLive(e *entry) {
	ne.move(e, ne.live)
	ne.live++
}

// remove removes e and reports whether the name has no pair left.
func (ne *nameEntries) remove(e *entry) (empty bool) {
	if !e.deferred {
		ne.setDeferred(e)
	}
	last := len(ne.entries) - 1
	ne.move(e, last)
	ne.entries[last] = nil
	ne.entries = ne.entries[:last]
	if ne.byAddr != nil {
		delete(ne.byAddr, e.addr)
		if last < indexFrom/2 { // the list again; and the map's memory back
			ne.byAddr = nil
		}
	}
	return last == 0
}

// move swaps e with the entry at slot i.
func (ne *nameEntries) move(e *entry, i int) {
	j := int(e.slot)
	ne.entries[i], ne.entries[j] = ne.entries[j], ne.entries[i]
	ne.entries[i].slot = int32(i)
	ne.entries[j].slot = int32(j)
}

// soonestLive is the live pair that expires first, or nil.
func (ne *nameEntries) soonestLive() *entry {
	var soonest *entry
	for _, e := range ne.entries[:ne.live] {
		if soonest == nil || e.expires < soonest.expires {
			soonest = e
		}
	}
	return soonest
}
