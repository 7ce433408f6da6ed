// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Counters are the enforcement program's verdict counts on IP traffic,
// summed over CPUs, since the pinned counters map was created (they survive
// agent restarts). A direction that is not enforced counts everything as
// allowed. The packet fields are totals over every reason; Drops splits the
// drops by reason.
type Counters struct {
	IngressAllowed, IngressDropped, EgressAllowed, EgressDropped uint64
	// Bytes (skb->len: from the Ethernet header on) of the same packets.
	IngressAllowedBytes, IngressDroppedBytes, EgressAllowedBytes, EgressDroppedBytes uint64
	// Drops has one entry per direction and drop reason (DropReasons),
	// ingress first.
	Drops []DropCount
}

// DropCount is the packets and bytes dropped in a direction for a reason.
type DropCount struct {
	Direction      policy.Direction
	Reason         Reason
	Packets, Bytes uint64
}

// DropReasons are the reasons the program drops for, each a slot of the
// counters map (abi.go).
func DropReasons() []Reason {
	return []Reason{ReasonNoPolicy, ReasonMalformed, ReasonPolicyDeny, ReasonVLANTagged, ReasonExtHeaders, ReasonFragment,
		ReasonSpoofedSource}
}

const (
	// countersValueSize: packets u64 | bytes u64 (abi.go).
	countersValueSize = 16
	// countersSlots per direction: allowed and the seven drop reasons.
	countersSlots   = 8
	countersEntries = 2 * countersSlots
	// The previous layout's slots and entries (openCountersMap).
	previousCountersSlots   = 4
	previousCountersEntries = 2 * previousCountersSlots
	// countAllowed is the slot of allowed packets; a drop's is its reason.
	countAllowed = 0
)

// counterValue is a counters map value on one CPU.
type counterValue struct {
	Packets, Bytes uint64
}

// counterIndex is the index of a direction's slot in the counters map
// (abi.go).
func counterIndex(direction policy.Direction, slot uint32) uint32 {
	return uint32(direction)*countersSlots + slot
}

// ReadCounters sums the per-CPU values of the counters map m.
//
// Possible errors: m is not a map of the counters layout.
func ReadCounters(m *ebpf.Map) (Counters, error) {
	sum := func(direction policy.Direction, slot uint32) (counterValue, error) {
		var perCPU []counterValue
		if err := m.Lookup(counterIndex(direction, slot), &perCPU); err != nil {
			return counterValue{}, fmt.Errorf("read counters: %w", err)
		}
		var total counterValue
		for _, v := range perCPU {
			total.Packets += v.Packets
			total.Bytes += v.Bytes
		}
		return total, nil
	}
	var c Counters
	for _, d := range []struct {
		direction                                 policy.Direction
		allowed, dropped, allowedBytes, dropBytes *uint64
	}{
		{policy.Ingress, &c.IngressAllowed, &c.IngressDropped, &c.IngressAllowedBytes, &c.IngressDroppedBytes},
		{policy.Egress, &c.EgressAllowed, &c.EgressDropped, &c.EgressAllowedBytes, &c.EgressDroppedBytes},
	} {
		allowed, err := sum(d.direction, countAllowed)
		if err != nil {
			return Counters{}, err
		}
		*d.allowed, *d.allowedBytes = allowed.Packets, allowed.Bytes
		for _, reason := range DropReasons() {
			dropped, err := sum(d.direction, uint32(reason))
			if err != nil {
				return Counters{}, err
			}
			*d.dropped += dropped.Packets
			*d.dropBytes += dropped.Bytes
			c.Drops = append(c.Drops, DropCount{Direction: d.direction, Reason: reason, Packets: dropped.Packets, Bytes: dropped.Bytes})
		}
	}
	return c, nil
}
