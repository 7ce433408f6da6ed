// SPDX-License-Identifier: Apache-2.0

package dnsproxy

import "errors"

var (
	// ErrConfig is a Config that cannot run a proxy: a hook missing or a
	// limit out of range.
	ErrConfig = errors.New("dnsproxy: invalid config")
	// ErrListen is a proxy socket that could not be made transparent or
	// bound (IP_TRANSPARENT needs CAP_NET_ADMIN; the port may be in use).
	ErrListen = errors.New("dnsproxy: cannot listen")
	// ErrReply is an answer that could not be sent from the server's
	// address.
	ErrReply = errors.New("dnsproxy: cannot send answer from server address")
)
