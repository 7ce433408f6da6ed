// SPDX-License-Identifier: Apache-2.0

package main

import "errors"

var (
	// errShellSocketInUse is returned by cleanup when an agent listens on
	// the shell socket it would remove: an agent that owns another state
	// directory, as this one's owner lock is held by cleanup.
	errShellSocketInUse = errors.New("an agent listens on it: stop it first")

	// errNotASocket is returned by cleanup when --shell-sock-path names
	// something that is not a socket, which it leaves alone.
	errNotASocket = errors.New("not a socket, left alone")
)

// errInvalidPolicyFiles is returned by `policy validate` when a file
// would be rejected (exit 1).
var errInvalidPolicyFiles = errors.New("invalid policy files")
