// SPDX-License-Identifier: Apache-2.0

package identity

import "strconv"

// Number is the number of a security identity, as the datapath sees
// it in the ipcache and policy maps.
type Number uint32

const (
	// Unknown is no identity.
	Unknown Number = 0

	// World is the identity of any address that is in no ipcache
	// entry.
	World Number = 2

	// LocalScope marks the identities allocated on this node (CIDR
	// identities), as in Cilium: local numbers are LocalScope|n for n in
	// 1..0xFFFFFF.
	LocalScope Number = 1 << 24

	// MinLocal and MaxLocal bound the local scope.
	MinLocal = LocalScope | 1
	MaxLocal = LocalScope | 0xFFFFFF

	// MinCluster and MaxCluster bound the label identities (of endpoints,
	// by their labels), Cilium's cluster range; numbers below MinCluster
	// are reserved.
	MinCluster Number = 256
	MaxCluster Number = 65535
)

// IsLocal reports whether the number is in the local scope.
func (id Number) IsLocal() bool {
	return id >= MinLocal && id <= MaxLocal
}

// IsCluster reports whether id is in the label identities' range.
func (id Number) IsCluster() bool {
	return id >= MinCluster && id <= MaxCluster
}

// String returns the number in decimal.
func (id Number) String() string { return strconv.FormatUint(uint64(id), 10) }
