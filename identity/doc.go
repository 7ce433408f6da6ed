// SPDX-License-Identifier: Apache-2.0

// Package identity is the vocabulary of security identity numbers: the
// number type every package uses for an identity (in tables, map keys and
// values, events and checkpoints) and the reserved and local ranges.
//
// It is a leaf: it imports no other package of the agent. The allocator
// that hands the numbers out is identitycell.
package identity
