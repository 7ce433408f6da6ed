// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/policy"

	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// Monitor events (bpf/enforce.c "Events", docs/CONTRACT.md "Monitor
// events"): the program writes one per drop, and one per allowed packet of
// an enforced direction, to its ring buffer, only while the agent asks
// (events_mask). The agent reads the ring only while a monitor client is
// subscribed, and hands every event to every subscriber that wants its
// kind, through a bounded buffer per subscriber: a subscriber that falls
// behind loses events (counted), the reader never waits for it.

// EventKinds selects the events a subscriber wants: the bits of the
// program's events_mask.
type EventKinds uint32

const (
	// EventDrops: one event per dropped packet.
	EventDrops EventKinds = 1 << 0
	// EventVerdicts: also one per allowed packet in an enforced direction.
	EventVerdicts EventKinds = 1 << 1
)

// eventSize is the size of struct event in bpf/enforce.c.
const eventSize = 64

// subscriberBuffer is how many events a subscriber may fall behind by
// before it loses events.
const subscriberBuffer = 4096

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
	Identity uint32
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

// decodeEvent decodes a struct event; monoNow and wallNow are the
// CLOCK_MONOTONIC_COARSE and wall times read together, to place the
// event's monotonic time on the wall clock.
//
// Possible errors: errShortEvent.
func decodeEvent(b []byte, monoNow uint64, wallNow time.Time) (Event, error) {
	if len(b) < eventSize {
		return Event{}, fmt.Errorf("%w: %d bytes", errShortEvent, len(b))
	}
	ne := binary.NativeEndian
	t := ne.Uint64(b[0:])
	e := Event{
		Time:      wallNow.Add(-time.Duration(int64(monoNow - t))),
		Ifindex:   ne.Uint32(b[8:]),
		Identity:  ne.Uint32(b[12:]),
		Direction: policy.Direction(b[16]),
		Allowed:   b[17] == 1,
		Reason:    bpfmaps.Reason(b[18]),
		Protocol:  b[20],
		ICMPType:  b[21],
	}
	family := b[19]
	// ports: endpoint_port then remote_port, both big endian.
	epPort := binary.BigEndian.Uint16(b[24:])
	remPort := binary.BigEndian.Uint16(b[26:])
	var ep, rem netip.Addr
	switch family {
	case 1:
		ep = netip.AddrFrom4([4]byte(b[32:36]))
		rem = netip.AddrFrom4([4]byte(b[48:52]))
	case 2:
		ep = netip.AddrFrom16([16]byte(b[32:48]))
		rem = netip.AddrFrom16([16]byte(b[48:64]))
	}
	if e.Direction == policy.Egress {
		e.Src, e.Dst, e.SrcPort, e.DstPort = ep, rem, epPort, remPort
	} else {
		e.Src, e.Dst, e.SrcPort, e.DstPort = rem, ep, remPort, epPort
	}
	return e, nil
}

var errShortEvent = errors.New("event shorter than the program's struct event")

// eventSubscriber is one monitor client's subscription.
type eventSubscriber struct {
	kinds EventKinds
	ch    chan Event
	lost  uint64 // under eventHub.mu
}

// eventHub reads the program's ring buffer while there are subscribers,
// and fans the events out to them.
type eventHub struct {
	mu     sync.Mutex
	events *ebpf.Map      // the loaded program's ring buffer; nil before
	mask   *ebpf.Variable // the program's events_mask
	subs   map[*eventSubscriber]struct{}
	reader *ringbuf.Reader
}

// setProgram gives the hub the loaded program's ring buffer and mask.
func (h *eventHub) setProgram(events *ebpf.Map, mask *ebpf.Variable) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events, h.mask = events, mask
}

// close stops the reader, at the datapath's stop.
func (h *eventHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.subs)
	if h.reader != nil {
		h.reader.Close()
		h.reader = nil
	}
	h.events, h.mask = nil, nil
}

// Subscribe starts handing events of kinds to the returned channel until
// cancel is called; lost says how many it missed by falling behind.
//
// Possible errors: ErrNoProgram when no program is loaded (no
// --devices), those of reading the ring buffer or setting the mask.
func (d *Datapath) Subscribe(kinds EventKinds) (events <-chan Event, cancel func() (lost uint64), err error) {
	h := &d.events
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.events == nil {
		return nil, nil, ErrNoProgram
	}
	sub := &eventSubscriber{kinds: kinds, ch: make(chan Event, subscriberBuffer)}
	if h.subs == nil {
		h.subs = map[*eventSubscriber]struct{}{}
	}
	if len(h.subs) == 0 {
		r, err := ringbuf.NewReader(h.events)
		if err != nil {
			return nil, nil, fmt.Errorf("read events: %w", err)
		}
		h.reader = r
		go h.read(r)
	}
	h.subs[sub] = struct{}{}
	if err := h.setMaskLocked(); err != nil {
		h.removeLocked(sub)
		return nil, nil, err
	}
	return sub.ch, func() uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[sub]; ok {
			h.removeLocked(sub)
		}
		return sub.lost
	}, nil
}

// removeLocked drops sub; the last one stops the reader and clears the
// mask, so that the program writes nothing.
func (h *eventHub) removeLocked(sub *eventSubscriber) {
	delete(h.subs, sub)
	_ = h.setMaskLocked()
	if len(h.subs) == 0 && h.reader != nil {
		// Close interrupts the reader's wait; the goroutine then returns
		// on its own (it may be waiting for mu to hand out a last event).
		h.reader.Close()
		h.reader = nil
	}
}

func (h *eventHub) setMaskLocked() error {
	var mask EventKinds
	for s := range h.subs {
		mask |= s.kinds
	}
	if err := h.mask.Set(uint32(mask)); err != nil {
		return fmt.Errorf("set events mask: %w", err)
	}
	return nil
}

// read hands out the ring's events until r is closed. Events written
// before it started (for an earlier subscriber, left in the ring) are
// skipped; the program's clock may lag by a tick, hence the margin.
func (h *eventHub) read(r *ringbuf.Reader) {
	start := monotonicNow() - 10*time.Millisecond
	var rec ringbuf.Record
	for {
		if err := r.ReadInto(&rec); err != nil {
			return // closed
		}
		e, err := decodeEvent(rec.RawSample, uint64(monotonicNow()), time.Now())
		if err != nil {
			continue
		}
		if int64(binary.NativeEndian.Uint64(rec.RawSample)) < int64(start) {
			continue
		}
		kind := EventDrops
		if e.Allowed {
			kind = EventVerdicts
		}
		h.mu.Lock()
		for s := range h.subs {
			if s.kinds&kind == 0 {
				continue
			}
			select {
			case s.ch <- e:
			default:
				s.lost++
			}
		}
		h.mu.Unlock()
	}
}

// EventsLost is the events the program could not write since it was
// loaded: refused by the rate limit, and by a full ring buffer, summed
// over CPUs.
//
// Possible errors: ErrNoProgram; the map cannot be read.
func (d *Datapath) EventsLost() (rateLimited, ringFull uint64, err error) {
	d.mu.Lock()
	enf := d.enforcer
	d.mu.Unlock()
	if enf == nil {
		return 0, 0, ErrNoProgram
	}
	var perCPU [][4]uint64
	if err := enf.eventState.Lookup(uint32(0), &perCPU); err != nil {
		return 0, 0, fmt.Errorf("read event_state: %w", err)
	}
	for _, s := range perCPU {
		rateLimited += s[2]
		ringFull += s[3]
	}
	return rateLimited, ringFull, nil
}
