// SPDX-License-Identifier: Apache-2.0

package fqdncell

import "errors"

var (
	// ErrInvalidConfig is a --tofqdns-* flag out of range.
	ErrInvalidConfig = errors.New("invalid DNS proxy configuration")
	// ErrNoDatapath is returned when the hive has no Datapath to tell the
	// proxy's port and to wait for the ipcache map on.
	ErrNoDatapath = errors.New("no datapath for the DNS proxy")
)
