// SPDX-License-Identifier: Apache-2.0

// Package endpointapi is the agent's endpoint socket: what the CNI plugin
// (cmd/ipcache-agent-cni) and the agent's CNI cell (cnicell) say to each
// other over it, and the client the plugin calls it with.
//
// One request per connection: the client writes one JSON [Request] and
// closes its writing side, the server answers with one JSON [Response]
// and closes the connection. Both are at most [MaxMessageSize] bytes
// (the answer to [Attachments], which only the plugin reads, at most
// [MaxAttachmentsSize]), and every step has a deadline, so that neither
// side waits on the other for ever nor the agent holds more than a
// message's worth of memory per connection.
//
// Owns: the protocol's types, limits and default socket path.
// Reads and writes: the socket it is given, nothing else.
package endpointapi
