// SPDX-License-Identifier: Apache-2.0

package endpointcell

import "errors"

var (
	// ErrEmptyFile is an endpoint file that became empty while it held
	// endpoints: they stay until it has content again or is removed.
	ErrEmptyFile = errors.New("file is empty, its endpoints stay in force until it has content again or is removed")

	// ErrClaimed is an endpoint, address, namespace or node that another
	// endpoint file holds.
	ErrClaimed = errors.New("claimed by another file")
)
