// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The layouts the tests write and read as the program and earlier agents
// did (bpfmaps holds the agent's own): the counters map's slots, and the
// previous layouts of the policy and conntrack maps that bpfmaps migrates.
const (
	countersSlots            = 8
	countersEntries          = 2 * countersSlots
	hashPolicyKeySize        = 8
	previousConntrackKeySize = 40
	policyValueSize          = len(bpfmaps.PolicyValue{})
	// countAllowed is the slot of allowed packets; a drop's is its reason.
	countAllowed = 0
	// readBatchSize is the entries of one block of bpfmaps.ReadEntries.
	readBatchSize = 4096
)

// counterIndex is the index of a direction's slot in the counters map.
func counterIndex(direction policy.Direction, slot uint32) uint32 {
	return uint32(direction)*countersSlots + slot
}

// counterValue is a counters map value on one CPU.
type counterValue struct {
	Packets, Bytes uint64
}

// policyMapKey is the map key of a rule as the previous layout wrote it:
// protocol 0 any protocol, port 0 every port of the protocol.
func policyMapKey(ident uint32, direction, protocol uint8, port uint16) bpfmaps.PolicyKey {
	key := policy.Key{Identity: identity.Number(ident), Direction: policy.Direction(direction)}
	if protocol != 0 {
		key.Protocol, key.Port = policy.Protocol(protocol), port
		if port == 0 {
			key.PortWildcardBits = 16
		}
	}
	return bpfmaps.NewPolicyKey(key)
}
