// SPDX-License-Identifier: Apache-2.0

package mapwrite

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

// KnownValues are the values a map held before its writer's first write,
// with the values written since to those keys (see Ops).
type KnownValues[K comparable, V comparable] interface {
	// get returns the value the map holds for k, if k is known.
	get(k K) (V, bool)
	// set records v as k's value if k is known; other keys are not added.
	set(k K, v V)
	// forget makes k unknown: deleted, or its value unknown.
	forget(k K)
	// known returns the keys still known.
	known() []K
}

// mapValues are KnownValues read from the map into a Go map.
type mapValues[K comparable, V comparable] map[K]V

func (m mapValues[K, V]) get(k K) (V, bool) {
	v, ok := m[k]
	return v, ok
}

func (m mapValues[K, V]) set(k K, v V) {
	if _, ok := m[k]; ok {
		m[k] = v
	}
}

func (m mapValues[K, V]) forget(k K) { delete(m, k) }

func (m mapValues[K, V]) known() []K { return slices.Collect(maps.Keys(m)) }

// snapshotValues are the ipcache map's KnownValues, kept over the snapshot
// the datapath took at start rather than in a map of their own: the
// snapshot is sorted, the writer writes in the same order, so a lookup is
// mostly a look at the entry after the last one found, and nothing the
// size of the map is built after a restart (docs/SCALE.md). The entries
// are shared with restore and are not modified; what changes is kept
// beside them.
type snapshotValues struct {
	entries []bpfmaps.IPCacheEntry // sorted by prefixkey.Compare; read only
	// gone marks the entries forgotten; changed has the values written
	// since to entries still known.
	gone    []bool
	changed map[int]bpfmaps.IPCacheValue
	// unreadable are the snapshot's keys that are no prefix, copied: they
	// are forgotten (deleted) at the first prune.
	unreadable map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue
	// next is where the next lookup looks first: after the last found.
	next int
}

// NewSnapshotValues returns the values the ipcache map held at start,
// kept over s, which is not modified: s is sorted in prefixkey.Compare
// order, as bpfmaps.ReadIPCacheMap returns it.
func NewSnapshotValues(s bpfmaps.IPCacheSnapshot) KnownValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue] {
	return &snapshotValues{
		entries:    s.Entries,
		gone:       make([]bool, len(s.Entries)),
		changed:    map[int]bpfmaps.IPCacheValue{},
		unreadable: maps.Clone(s.Unreadable),
	}
}

// find returns the index of k's entry, or false if k is no canonical
// prefix key of an entry (unreadable keys are not entries).
func (s *snapshotValues) find(k bpfmaps.IPCacheKey) (int, bool) {
	prefix, err := k.Prefix()
	if err != nil {
		return 0, false
	}
	for _, i := range [2]int{s.next, s.next - 1} {
		if i >= 0 && i < len(s.entries) && s.entries[i].Prefix == prefix {
			s.next = i + 1
			return i, true
		}
	}
	i, found := slices.BinarySearchFunc(s.entries, prefix, func(e bpfmaps.IPCacheEntry, p netip.Prefix) int {
		return prefixkey.Compare(e.Prefix, p)
	})
	if found {
		s.next = i + 1
	}
	return i, found
}

func (s *snapshotValues) get(k bpfmaps.IPCacheKey) (bpfmaps.IPCacheValue, bool) {
	i, ok := s.find(k)
	switch {
	case !ok:
		v, known := s.unreadable[k]
		return v, known
	case s.gone[i]:
		return bpfmaps.IPCacheValue{}, false
	}
	if v, changed := s.changed[i]; changed {
		return v, true
	}
	return bpfmaps.NewIPCacheValue(s.entries[i].Identity), true
}

func (s *snapshotValues) set(k bpfmaps.IPCacheKey, v bpfmaps.IPCacheValue) {
	i, ok := s.find(k)
	switch {
	case ok && !s.gone[i]:
		s.changed[i] = v
	case !ok:
		if _, known := s.unreadable[k]; known {
			s.unreadable[k] = v
		}
	}
}

func (s *snapshotValues) forget(k bpfmaps.IPCacheKey) {
	if i, ok := s.find(k); ok {
		s.gone[i] = true
		delete(s.changed, i)
		return
	}
	delete(s.unreadable, k)
}

func (s *snapshotValues) known() []bpfmaps.IPCacheKey {
	var keys []bpfmaps.IPCacheKey
	for i, e := range s.entries {
		if !s.gone[i] {
			keys = append(keys, bpfmaps.NewIPCacheKey(e.Prefix))
		}
	}
	for k := range s.unreadable {
		keys = append(keys, k)
	}
	return keys
}
