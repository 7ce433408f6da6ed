// SPDX-License-Identifier: Apache-2.0

// Package craft builds Ethernet frames that no socket API would send (stacked
// VLAN tags, chains of IPv6 extension headers, ICMP errors quoting a chosen
// flow, neighbour discovery typed packets to any address, packets with a
// spoofed source, IPv4 and IPv6 fragments at any offset: Fragment, Split) and sends them from inside a network namespace through an
// AF_PACKET socket bound to one interface, so that they enter the link
// exactly as written: the sender's own IP stack never sees them.
//
// A frame is made in two steps: Serialize turns gopacket layers (IPv4 or
// IPv6 and what follows) into an IP packet with lengths and checksums filled
// in, and Ethernet puts it in a frame with the link's addresses and any VLAN
// tags. Quote cuts a packet down to what an ICMP error carries of it.
//
// Whether a packet was delivered is read on the other side with Listen: a
// raw IP socket of one protocol, which the kernel hands a copy of every
// packet of that protocol it delivers locally, after the receiving device's
// TCX hooks and the IP stack's checks (a packet the enforcement program
// drops, or one the kernel discards, never reaches it). Packets are told
// apart by a marker (Marker) the test puts in their payload.
//
// Everything here is for privileged tests: AF_PACKET and raw sockets need
// CAP_NET_RAW, and entering a namespace CAP_SYS_ADMIN.
package craft
