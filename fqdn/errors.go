// SPDX-License-Identifier: Apache-2.0

package fqdn

import "errors"

var (
	// ErrEmptySelector is returned by [Selector.Validate] and
	// [Selector.Compile] for a selector with neither matchName nor
	// matchPattern.
	ErrEmptySelector = errors.New("toFQDNs selector needs matchName or matchPattern")

	// ErrBothSelectors is returned by [Selector.Validate] and
	// [Selector.Compile] for a selector with both matchName and
	// matchPattern: each selector is one or the other, as in Cilium.
	ErrBothSelectors = errors.New("toFQDNs selector has both matchName and matchPattern: use one per selector")

	// ErrInvalidName is returned (wrapped, quoting the name and saying
	// what is wrong) by [Selector.Validate] and [Selector.Compile] for a
	// matchName that is not a DNS name: empty labels, characters other
	// than letters, digits, '-', '_' and '.', or longer than 255.
	ErrInvalidName = errors.New("invalid matchName")

	// ErrInvalidPattern is returned (wrapped, quoting the pattern and
	// saying what is wrong) by [Selector.Validate] and [Selector.Compile]
	// for a matchPattern with empty labels, characters other than
	// letters, digits, '-', '_', '.' and '*', longer than 255, or "**"
	// (which newer Cilium gives a meaning across labels that this agent
	// does not enforce, so it is refused rather than read differently).
	ErrInvalidPattern = errors.New("invalid matchPattern")

	// ErrCorruptCheckpoint is returned (wrapped, saying what is wrong) by
	// [ReadCheckpoint] for a checkpoint that cannot be decoded, that is
	// larger than its bound, or that lists an entry that is not valid.
	ErrCorruptCheckpoint = errors.New("corrupt fqdn checkpoint")
)

// detailError is a sentinel with what is wrong: errors.Is finds the
// sentinel, and the message carries both.
type detailError struct {
	sentinel error
	detail   string
}

func (e detailError) Error() string { return e.sentinel.Error() + " " + e.detail }

func (e detailError) Unwrap() error { return e.sentinel }
