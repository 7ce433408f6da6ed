// SPDX-License-Identifier: Apache-2.0

// Package dnsproxy is the userspace side of the transparent DNS proxy:
// UDP and TCP sockets on one port with IP_TRANSPARENT, which receive the
// DNS queries that the steering program (dnsproxy/bpf) assigns to them
// although they are addressed to another host's port 53.
//
// For each query it learns the client and the server the query was sent
// to (IP_ORIGDSTADDR for UDP, the accepted connection's local address for
// TCP), asks the Allow hook whether the name may be resolved (REFUSED
// otherwise, and the query goes nowhere), forwards the query to that
// server from the host's own address, hands the answer to the OnAnswer
// hook, which may hold it for a bounded time, and sends it to the client
// from the server's address and port (for UDP through a transparent
// socket bound to that address, for TCP on the accepted connection).
//
// It owns its sockets and nothing else: it reads DNS messages
// (github.com/miekg/dns) and writes no map, file or identity. What a name
// allows and what an answer is waited for belong to the hooks' owner.
package dnsproxy
