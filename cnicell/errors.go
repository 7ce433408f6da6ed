// SPDX-License-Identifier: Apache-2.0

package cnicell

import "errors"

var (
	// ErrNotRegistered is a CHECK of an endpoint the plugin did not
	// register, or registered for another container or interface.
	ErrNotRegistered = errors.New("endpoint not registered by the CNI plugin")

	// ErrMismatch is a CHECK of an endpoint registered with other labels,
	// addresses or host-side interface than the request's.
	ErrMismatch = errors.New("endpoint registered differently")

	// ErrBusy is a request beyond the number of requests served at once.
	ErrBusy = errors.New("endpoint socket busy")

	// ErrSocketInUse is a --cni-sock-path another agent listens on: the
	// start fails.
	ErrSocketInUse = errors.New("in use by another agent")

	// ErrCorruptState is a state file that cannot be decoded. The cell
	// does not return it: it sets such a file aside and starts without it.
	ErrCorruptState = errors.New("corrupt CNI endpoint state file")
)
