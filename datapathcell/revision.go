// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
)

// revision (array of one u64, BPF_F_MMAPABLE, pinned) counts the writes
// that can change a verdict: to the ipcache, policy and enforcement maps.
// The program keeps, in a conntrack entry, the revision at which policy
// last allowed the connection's forward direction, and skips the policy
// lookups of a forward packet while the revision is still that one
// (bpf/enforce.c). So every such write is followed by a bump, once the
// write has returned: a packet that reads the new revision looks policy
// up again and sees the write.
//
// Only the low 48 bits are compared (the entry has room for those): a
// stored revision matches again only after 2^48 bumps, and the agent never
// leaves them at 0, which the program reads as "no verdict stored".
const revisionMask = 1<<48 - 1

// revisionCounter bumps the pinned revision through a shared mapping of
// the map, so that each bump is one atomic 64-bit add: a map update copies
// the value in a way the program may read half done, and a half-done
// revision could equal an old one.
type revisionCounter struct {
	// mu keeps Close from unmapping under a bump: a writer may still
	// hold its maps when the datapath stops.
	mu   sync.RWMutex
	mem  []byte
	word *uint64
}

// newRevisionCounter maps the revision map m.
//
// Possible errors: m is not mmapable (bpfmaps.RevisionSpec) or cannot be mapped.
func newRevisionCounter(m *ebpf.Map) (*revisionCounter, error) {
	mem, err := unix.Mmap(m.FD(), 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map revision counter: %w", err)
	}
	// The mapping is page-aligned and outside the Go heap.
	return &revisionCounter{mem: mem, word: (*uint64)(unsafe.Pointer(&mem[0]))}, nil
}

// bump counts one write that can change a verdict. A nil counter (tests
// with fake maps, which have no program) does nothing.
func (r *revisionCounter) bump() {
	if r == nil {
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.word == nil {
		return // closed: the maps are closed too, the write failed
	}
	for atomic.AddUint64(r.word, 1)&revisionMask == 0 {
	}
}

// load is the current revision.
func (r *revisionCounter) load() uint64 { return atomic.LoadUint64(r.word) }

// startAbove sets the counter above every revision an entry of ct can
// hold, if the counter is new (0: the pin was created or replaced while
// the conntrack map was kept), and then bumps it: the maps were opened,
// maybe migrated or replaced, and the program reloaded, so no verdict
// stored before counts. A counter that was kept only grows, so a restart
// never makes an old entry's revision current again.
//
// Possible errors: ct cannot be read.
func (r *revisionCounter) startAbove(cts ...*ebpf.Map) error {
	if r.load()&revisionMask == 0 {
		var highest uint64
		for _, ct := range cts {
			if ct == nil {
				continue
			}
			err := bpfmaps.ReadEntries(ct, func(_ bpfmaps.ConntrackKey, v bpfmaps.ConntrackValue) { highest = max(highest, v.Checked()) })
			if err != nil {
				return fmt.Errorf("read conntrack map for the revision: %w", err)
			}
		}
		atomic.StoreUint64(r.word, highest)
	}
	r.bump()
	return nil
}

// Close unmaps the counter.
func (r *revisionCounter) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem, r.word = nil, nil
	if err != nil {
		return fmt.Errorf("unmap revision counter: %w", err)
	}
	return nil
}

// revisedMap is a map the agent writes whose every write may change a
// verdict: each write is followed by a bump, also a failed one (a batch
// may have written part of its keys). All writers of the ipcache, policy
// and enforcement maps get these maps from Datapath.written, so no write
// path can miss the bump.
type revisedMap struct {
	mapwrite.Map
	revision *revisionCounter
}

func (m revisedMap) Put(key, value any) error {
	defer m.revision.bump()
	return m.Map.Put(key, value)
}

func (m revisedMap) Delete(key any) error {
	defer m.revision.bump()
	return m.Map.Delete(key)
}

func (m revisedMap) BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error) {
	defer m.revision.bump()
	return m.Map.BatchUpdate(keys, values, opts)
}

func (m revisedMap) BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error) {
	defer m.revision.bump()
	return m.Map.BatchDelete(keys, opts)
}
