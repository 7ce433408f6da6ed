// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"github.com/cilium/ebpf"
)

// Map names: the pin names under <bpf-root>/ipcache-agent/ and the names
// the enforcement program declares (bpf/enforce.c).
const (
	IPCacheName     = "ipcache"
	PolicyName      = "policy"
	EnforcementName = "enforcement"
	CountersName    = "counters"
	ConntrackName   = "conntrack"
	// ConntrackOpeningName is the map of connections that have not yet
	// had their origin speak after a reply (conntrack.go).
	ConntrackOpeningName = "ct_opening"
	RevisionName         = "revision"
	EndpointsName        = "endpoints"
	// DNSProxyName is the pin of the DNS proxy's port (abi.go); the
	// program declares the map as dns_proxy.
	DNSProxyName = "dns-proxy"
	// DNSAnswersName is the pin of the ring buffer of DNS answers that
	// bypassed the proxy, DNSAnswersLostName of its lost records
	// (dnsanswers.go); the program declares them as dns_answers and
	// dns_answers_lost.
	DNSAnswersName     = "dns-answers"
	DNSAnswersLostName = "dns-answers-lost"
)

// bpfFNoPrealloc is BPF_F_NO_PREALLOC, required for LPM tries.
const bpfFNoPrealloc = 1

// bpfFMmapable is BPF_F_MMAPABLE: the agent adds to the revision counter
// through a shared mapping, in one atomic instruction (revision.go).
const bpfFMmapable = 1 << 10

// The specs of the pinned maps (layouts in abi.go).

// IPCacheSpec is the spec of the ipcache map (an LPM trie) with the
// given capacity. Besides the datapath, tools that need a map of the same
// layout use it (the scale benchmark's raw-write floor).
func IPCacheSpec(maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       IPCacheName,
		Type:       ebpf.LPMTrie,
		KeySize:    ipcacheKeySize,
		ValueSize:  ipcacheValueSize,
		MaxEntries: maxEntries,
		Flags:      bpfFNoPrealloc,
	}
}

// PolicySpec: an LPM trie, so that one entry covers a block of ports
// (a port range is a few aligned blocks, as in Cilium's policy map).
func PolicySpec(maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       PolicyName,
		Type:       ebpf.LPMTrie,
		KeySize:    policyKeySize,
		ValueSize:  policyValueSize,
		MaxEntries: maxEntries,
		Flags:      bpfFNoPrealloc,
	}
}

// PoliciesSpec is the spec of the outer policy map (pinned as
// PolicyName): a hash of maps from a subject to its policy map, an LPM
// trie of PolicySpec(innerMaxEntries). Room for every subject
// (PolicySubjects), allocated as subjects come (BPF_F_NO_PREALLOC). The
// kernel compares an inserted map with the inner spec by type, key and
// value size and flags, not max entries: a subject's map may have another
// size.
func PoliciesSpec(innerMaxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       PolicyName,
		Type:       ebpf.HashOfMaps,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: PolicySubjects,
		Flags:      bpfFNoPrealloc,
		InnerMap:   PolicySpec(innerMaxEntries),
	}
}

// EndpointsSpec is the spec of the endpoints map: a hash from a local
// endpoint's address to its identity and device (abi.go).
func EndpointsSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       EndpointsName,
		Type:       ebpf.Hash,
		KeySize:    endpointKeySize,
		ValueSize:  endpointValueSize,
		MaxEntries: EndpointsMaxEntries,
		Flags:      bpfFNoPrealloc,
	}
}

// EnforcementSpec is the spec of the enforcement map: an array indexed by
// a subject's direction (EnforcementKey), both directions of every
// subject. The previous layout, an array of the default's 2, differs
// only in max entries: Open migrates it, its values at the same indices.
func EnforcementSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       EnforcementName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: 2 * PolicySubjects,
	}
}

// CountersSpec is the spec of the counters map: a per-CPU array of a slot
// per direction and verdict (counters.go).
func CountersSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       CountersName,
		Type:       ebpf.PerCPUArray,
		KeySize:    4,
		ValueSize:  countersValueSize,
		MaxEntries: countersEntries,
	}
}

// ConntrackSpec: a hash, which never evicts: a connection gets here
// only once its handshake is done, and a flood of new connections cannot
// push it out (layout in conntrack.go).
func ConntrackSpec(maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       ConntrackName,
		Type:       ebpf.Hash,
		KeySize:    conntrackKeySize,
		ValueSize:  conntrackValueSize,
		MaxEntries: maxEntries,
	}
}

// ConntrackOpeningSpec: an LRU hash of conntrack's layout, so that a
// full map evicts the least recently used new connections rather than
// refusing the next one.
func ConntrackOpeningSpec(maxEntries uint32) *ebpf.MapSpec {
	spec := ConntrackSpec(maxEntries)
	spec.Name = ConntrackOpeningName
	spec.Type = ebpf.LRUHash
	return spec
}

// RevisionSpec: one u64, the revision counter (revision.go).
func RevisionSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       RevisionName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  8,
		MaxEntries: 1,
		Flags:      bpfFMmapable,
	}
}

// DNSProxySpec: one u32, the DNS proxy's port (abi.go).
func DNSProxySpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       DNSProxyName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  dnsProxyValueSize,
		MaxEntries: 1,
	}
}
