// SPDX-License-Identifier: Apache-2.0

package identitycell

import "errors"

var (
	// ErrExhausted is returned (wrapped) by [Allocator.AllocateTxn] when
	// every number of the space the labels need (local, or the label
	// identities') is allocated or withheld; the message names the space.
	// Only the request that hit it fails.
	ErrExhausted = errors.New("identity space exhausted")

	// ErrTooManyReferences is returned (wrapped) by [Allocator.AllocateTxn]
	// when the identity of the labels already has 2^31-1 references, the
	// most a row counts. Only the request that hit it fails.
	ErrTooManyReferences = errors.New("identity reference count at its limit")

	// ErrNotAllocated is returned (wrapped) by [Allocator.ReleaseTxn] when
	// releasing a number that is not allocated: the caller released a
	// reference it did not hold.
	ErrNotAllocated = errors.New("identity not allocated")

	// ErrLocalHeld is returned by [Allocator.AllocateTxn] when
	// a label set without an identity would take a local number that is
	// not withheld for its request while the local space is held
	// ([Allocator.HoldLocal]): restore may yet withhold that number.
	// Nothing was allocated; the caller asks again once
	// [Allocator.LocalReleased] is closed.
	ErrLocalHeld = errors.New("local identity numbers held until restore has withheld the previous run's")

	// ErrNoLabels is returned by [Allocator.AllocateTxn] when allocating an
	// identity for the empty label set.
	ErrNoLabels = errors.New("identity needs at least one label")

	// ErrCorruptCheckpoint is returned (wrapped) by [ReadCheckpoint] for a
	// checkpoint file that cannot be decoded. [Checkpointer.Start] does not
	// return it: it moves such a file aside and restores without it.
	ErrCorruptCheckpoint = errors.New("corrupt identity checkpoint")
)

// corruptError is what decoding a checkpoint fails with: it is
// ErrCorruptCheckpoint, and says what is wrong.
type corruptError struct{ detail string }

func (e corruptError) Error() string { return "corrupt: " + e.detail }

func (e corruptError) Is(target error) bool { return target == ErrCorruptCheckpoint }

// exhaustedError is what a full space fails with: it is ErrExhausted, and
// names the space ("local identity space exhausted").
type exhaustedError struct{ space string }

func (e exhaustedError) Error() string { return e.space + " " + ErrExhausted.Error() }

func (e exhaustedError) Is(target error) bool { return target == ErrExhausted }

// ErrNoIdentity is the error of the identity commands for identity 0,
// which is no identity (Unknown; in a policy entry, any peer).
var ErrNoIdentity = errors.New("identity 0 is not an identity (unknown; policy entries use it for any peer)")
