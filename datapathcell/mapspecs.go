// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/cilium/ebpf"
)

// Map names: the pin names under <bpf-root>/ipcache-agent/ and the names
// the enforcement program declares (bpf/enforce.c).
const (
	IPCacheMapName     = "ipcache"
	PolicyMapName      = "policy"
	EnforcementMapName = "enforcement"
	CountersMapName    = "counters"
	ConntrackMapName   = "conntrack"
	// ConntrackOpeningMapName is the map of connections that have not yet
	// had their origin speak after a reply (conntrack.go).
	ConntrackOpeningMapName = "ct_opening"
	RevisionMapName         = "revision"
)

// bpfFNoPrealloc is BPF_F_NO_PREALLOC, required for LPM tries.
const bpfFNoPrealloc = 1

// bpfFMmapable is BPF_F_MMAPABLE: the agent adds to the revision counter
// through a shared mapping, in one atomic instruction (revision.go).
const bpfFMmapable = 1 << 10

// The specs of the pinned maps (layouts in abi.go).

// IPCacheMapSpec is the spec of the ipcache map (an LPM trie) with the
// given capacity. Besides the datapath, tools that need a map of the same
// layout use it (the scale benchmark's raw-write floor).
func IPCacheMapSpec(maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       IPCacheMapName,
		Type:       ebpf.LPMTrie,
		KeySize:    ipcacheKeySize,
		ValueSize:  ipcacheValueSize,
		MaxEntries: maxEntries,
		Flags:      bpfFNoPrealloc,
	}
}

// policyMapSpec: an LPM trie, so that one entry covers a block of ports
// (a port range is a few aligned blocks, as in Cilium's policy map).
func policyMapSpec(maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       PolicyMapName,
		Type:       ebpf.LPMTrie,
		KeySize:    policyKeySize,
		ValueSize:  policyValueSize,
		MaxEntries: maxEntries,
		Flags:      bpfFNoPrealloc,
	}
}

func enforcementMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       EnforcementMapName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: 2,
	}
}

func countersMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       CountersMapName,
		Type:       ebpf.PerCPUArray,
		KeySize:    4,
		ValueSize:  countersValueSize,
		MaxEntries: countersEntries,
	}
}

// conntrackMapSpec: a hash, which never evicts: a connection gets here
// only once its handshake is done, and a flood of new connections cannot
// push it out (layout in conntrack.go).
func conntrackMapSpec(maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       ConntrackMapName,
		Type:       ebpf.Hash,
		KeySize:    conntrackKeySize,
		ValueSize:  conntrackValueSize,
		MaxEntries: maxEntries,
	}
}

// conntrackOpeningMapSpec: an LRU hash of conntrack's layout, so that a
// full map evicts the least recently used new connections rather than
// refusing the next one.
func conntrackOpeningMapSpec(maxEntries uint32) *ebpf.MapSpec {
	spec := conntrackMapSpec(maxEntries)
	spec.Name = ConntrackOpeningMapName
	spec.Type = ebpf.LRUHash
	return spec
}

// revisionMapSpec: one u64, the revision counter (revision.go).
func revisionMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       RevisionMapName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  8,
		MaxEntries: 1,
		Flags:      bpfFMmapable,
	}
}
