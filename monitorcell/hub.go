// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/hive/cell"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
)

// The hub reads the program's ring only while a monitor client is
// subscribed, and hands every event to every subscriber that wants its
// kind, through a bounded buffer per subscriber: a subscriber that falls
// behind loses events (counted), the reader never waits for it.

// subscriberBuffer is how many events a subscriber may fall behind by
// before it loses events: program events and DNS events each.
const subscriberBuffer = 4096

// subscriber is one monitor client's subscription.
type subscriber struct {
	kinds events.Kinds
	ch    chan events.Event
	lost  uint64 // under Hub.mu
}

// dnsSubscriber is one monitor client's subscription to the DNS proxy's
// events.
type dnsSubscriber struct {
	ch   chan events.DNS
	lost uint64 // under Hub.mu
}

// Hub reads the loaded program's ring buffer while there are subscribers,
// and fans the events out to them; it fans the DNS proxy's events out
// too, which need no program.
type Hub struct {
	source events.Source

	// dnsCount is len(dnsSubs), read without mu so that a DNS event
	// nobody wants costs the proxy one atomic load.
	dnsCount atomic.Int32

	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	reader *ringbuf.Reader
	// stopped is set by the stop hook, which runs before the datapath's
	// (the hub depends on its Source): nothing reads the program after.
	stopped bool
	// dnsSubs need no program: the stop leaves them to their cancel.
	dnsSubs map[*dnsSubscriber]struct{}
}

func newHub(source events.Source) *Hub {
	return &Hub{source: source, subs: map[*subscriber]struct{}{}, dnsSubs: map[*dnsSubscriber]struct{}{}}
}

// newLifecycleHub returns the Hub with its stop hook appended to the
// lifecycle.
func newLifecycleHub(source events.Source, lc cell.Lifecycle) *Hub {
	h := newHub(source)
	lc.Append(cell.Hook{OnStop: func(cell.HookContext) error {
		h.stop()
		return nil
	}})
	return h
}

// stop stops the reader and drops the subscribers, before the datapath
// closes the program.
func (h *Hub) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.subs)
	if h.reader != nil {
		h.reader.Close()
		h.reader = nil
	}
	h.stopped = true
}

// Subscribe starts handing the program's events of kinds (of
// events.ProgramKinds; DNS events are SubscribeDNS's) to the returned
// channel until cancel is called; lost says how many it missed by falling
// behind.
//
// Possible errors: events.ErrNoProgram when no program is loaded (no
// --devices), those of reading the ring buffer or setting the mask.
func (h *Hub) Subscribe(kinds events.Kinds) (subscribed <-chan events.Event, cancel func() (lost uint64), err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, nil, events.ErrNoProgram
	}
	ring, err := h.source.Ring()
	if err != nil {
		return nil, nil, err
	}
	sub := &subscriber{kinds: kinds, ch: make(chan events.Event, subscriberBuffer)}
	if len(h.subs) == 0 {
		r, err := ringbuf.NewReader(ring)
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
func (h *Hub) removeLocked(sub *subscriber) {
	delete(h.subs, sub)
	_ = h.setMaskLocked()
	if len(h.subs) == 0 && h.reader != nil {
		// Close interrupts the reader's wait; the goroutine then returns
		// on its own (it may be waiting for mu to hand out a last event).
		h.reader.Close()
		h.reader = nil
	}
}

func (h *Hub) setMaskLocked() error {
	var mask events.Kinds
	for s := range h.subs {
		mask |= s.kinds & events.ProgramKinds
	}
	return h.source.SetMask(mask)
}

// read hands out the ring's events until r is closed. Events written
// before it started (for an earlier subscriber, left in the ring) are
// skipped; the program's clock may lag by a tick, hence the margin.
func (h *Hub) read(r *ringbuf.Reader) {
	start := bpfmaps.MonotonicNow() - 10*time.Millisecond
	var rec ringbuf.Record
	for {
		if err := r.ReadInto(&rec); err != nil {
			return // closed
		}
		e, err := events.Decode(rec.RawSample, uint64(bpfmaps.MonotonicNow()), time.Now())
		if err != nil {
			continue
		}
		if int64(events.Timestamp(rec.RawSample)) < int64(start) {
			continue
		}
		h.dispatch(e)
	}
}

// dispatch hands e to every subscriber that wants its kind.
func (h *Hub) dispatch(e events.Event) {
	kind := events.Drops
	if e.Allowed {
		kind = events.Verdicts
	}
	h.mu.Lock()
	defer h.mu.Unlock()
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
}

var _ events.DNSPublisher = (*Hub)(nil)

// SubscribeDNS starts handing the DNS proxy's events to the returned
// channel until cancel is called; lost says how many it missed by falling
// behind. It needs no program: the proxy publishes from user space.
func (h *Hub) SubscribeDNS() (subscribed <-chan events.DNS, cancel func() (lost uint64)) {
	sub := &dnsSubscriber{ch: make(chan events.DNS, subscriberBuffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dnsSubs[sub] = struct{}{}
	h.dnsCount.Store(int32(len(h.dnsSubs)))
	return sub.ch, func() uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.dnsSubs, sub)
		h.dnsCount.Store(int32(len(h.dnsSubs)))
		return sub.lost
	}
}

// PublishDNS hands e to every DNS subscriber that has room for it, and
// counts it lost for the others: the proxy never waits for a client.
// Addresses beyond events.MaxDNSAddresses are left out.
func (h *Hub) PublishDNS(e events.DNS) {
	if h.dnsCount.Load() == 0 {
		return
	}
	if len(e.Addresses) > events.MaxDNSAddresses {
		e.Addresses = e.Addresses[:events.MaxDNSAddresses:events.MaxDNSAddresses]
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.dnsSubs {
		select {
		case s.ch <- e:
		default:
			s.lost++
		}
	}
}
