// SPDX-License-Identifier: Apache-2.0

package endpoint

import "errors"

var (
	// ErrInvalid is an endpoint that cannot be registered as given (no
	// address, a bad name or label).
	ErrInvalid = errors.New("invalid endpoint")

	// ErrAddressInUse is an address another endpoint already has.
	ErrAddressInUse = errors.New("address in use by another endpoint")

	// ErrOwnedByOther is an endpoint another source registered.
	ErrOwnedByOther = errors.New("endpoint registered by another source")

	// ErrTooMany is an endpoint beyond the number of endpoints, or of
	// addresses, the agent holds.
	ErrTooMany = errors.New("too many endpoints")

	// ErrSourceExists is a second source with the same owner.
	ErrSourceExists = errors.New("endpoint source already exists")

	// ErrNotFound is an endpoint that is not registered.
	ErrNotFound = errors.New("endpoint not found")
)
