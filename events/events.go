// SPDX-License-Identifier: Apache-2.0

package events

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Monitor events (bpf/enforce.c "Events", docs/CONTRACT.md "Monitor
// events"): the program writes one per drop, and one per allowed packet of
// an enforced direction, to its ring buffer, only while the agent asks
// (events_mask).

// Kinds selects the events a subscriber wants: the bits of the program's
// events_mask (ProgramKinds), and DNSQueries.
type Kinds uint32

const (
	// Drops: one event per dropped packet.
	Drops Kinds = 1 << 0
	// Verdicts: also one per allowed packet in an enforced direction.
	Verdicts Kinds = 1 << 1
	// DNSQueries: one event per query the DNS proxy handled (DNS). Not a
	// bit of the program's: it must never reach its events_mask.
	DNSQueries Kinds = 1 << 16

	// ProgramKinds are the kinds the program writes, the bits its
	// events_mask may have.
	ProgramKinds = Drops | Verdicts
)

// Size is the size of struct event in bpf/enforce.c (bpf.EnforceEvent,
// generated from it): one ring-buffer record.
const Size = 64

// Event is one decoded event of the program.
type Event struct {
	// Time is when the program saw the packet (to a clock tick).
	Time      time.Time
	Ifindex   uint32
	Direction policy.Direction
	Allowed   bool
	Reason    bpfmaps.Reason
	// Identity is the remote address's; 0 when not known (a malformed
	// packet).
	Identity identity.Number
	// Endpoint is the subject whose policy decided: the identity of the
	// local endpoint whose packet it is, 0 for the host-wide default (no
	// local endpoint). For a spoofed-source drop, the identity of the
	// endpoint whose address it carried.
	Endpoint identity.Number
	// Protocol is the IP protocol (next header); 0 for a malformed packet.
	Protocol uint8
	// Src and Dst are invalid for a malformed packet.
	Src, Dst netip.Addr
	// SrcPort and DstPort are the ports of TCP, UDP and SCTP; for ICMP
	// echo the identifier is in the endpoint's one.
	SrcPort, DstPort uint16
	// ICMPType is set for ICMP and ICMPv6.
	ICMPType uint8
}

// Decode decodes a struct event; monoNow and wallNow are the
// CLOCK_MONOTONIC_COARSE and wall times read together, to place the
// event's monotonic time on the wall clock.
//
// Possible errors: the record is shorter than Size.
func Decode(b []byte, monoNow uint64, wallNow time.Time) (Event, error) {
	if len(b) < Size {
		return Event{}, fmt.Errorf("%w: %d bytes", errShortEvent, len(b))
	}
	var r bpf.EnforceEvent
	if _, err := binary.Decode(b[:Size], binary.NativeEndian, &r); err != nil {
		return Event{}, fmt.Errorf("%w: %w", errShortEvent, err)
	}
	e := Event{
		Time:      wallNow.Add(-time.Duration(int64(monoNow - r.TimeNs))),
		Ifindex:   r.Ifindex,
		Identity:  identity.Number(r.Identity),
		Endpoint:  identity.Number(r.Subject),
		Direction: policy.Direction(r.Direction),
		Allowed:   r.Verdict == 1,
		Reason:    bpfmaps.Reason(r.Reason),
		Protocol:  r.Protocol,
		ICMPType:  r.IcmpType,
	}
	// ports holds the endpoint's port then the remote one, each in network
	// order, as the program stores them.
	var ports [4]byte
	binary.NativeEndian.PutUint32(ports[:], r.Ports)
	epPort, remPort := binary.BigEndian.Uint16(ports[0:]), binary.BigEndian.Uint16(ports[2:])
	var ep, rem netip.Addr
	switch r.Family {
	case 1:
		ep, rem = netip.AddrFrom4([4]byte(r.EndpointAddr[:4])), netip.AddrFrom4([4]byte(r.RemoteAddr[:4]))
	case 2:
		ep, rem = netip.AddrFrom16(r.EndpointAddr), netip.AddrFrom16(r.RemoteAddr)
	}
	if e.Direction == policy.Egress {
		e.Src, e.Dst, e.SrcPort, e.DstPort = ep, rem, epPort, remPort
	} else {
		e.Src, e.Dst, e.SrcPort, e.DstPort = rem, ep, remPort, epPort
	}
	return e, nil
}

// Timestamp is a record's CLOCK_MONOTONIC_COARSE time in nanoseconds, as
// the program wrote it, for a reader to tell records written before it
// started from its own; 0 for a record shorter than Size.
func Timestamp(b []byte) uint64 {
	if len(b) < Size {
		return 0
	}
	return binary.NativeEndian.Uint64(b[0:])
}
