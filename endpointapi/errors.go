// SPDX-License-Identifier: Apache-2.0

package endpointapi

import "errors"

var (
	// ErrAgentNotRunning is a socket nothing accepts connections on: no
	// agent is running, or it does not serve the endpoint socket there.
	ErrAgentNotRunning = errors.New("ipcache-agent is not running")

	// ErrRejected is a request the agent answered with an error; the
	// agent's message follows it.
	ErrRejected = errors.New("ipcache-agent rejected the request")

	// ErrMessageTooLarge is a request or response over MaxMessageSize.
	ErrMessageTooLarge = errors.New("message too large")

	// ErrBadMessage is a request or response that does not decode, or a
	// request without what its command needs.
	ErrBadMessage = errors.New("bad message")
)
