// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
)

// monotonicNow is CLOCK_MONOTONIC_COARSE, the program's
// bpf_ktime_get_coarse_ns.
func monotonicNow() time.Duration {
	var ts unix.Timespec
	// CLOCK_MONOTONIC_COARSE cannot fail on Linux.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return time.Duration(ts.Nano())
}

// ConntrackTimeouts are how long an entry lives after its last packet.
type ConntrackTimeouts struct {
	TCPOpening, TCPEstablished, TCPClosing, Other time.Duration
}

// uniformConntrackTimeouts gives every state the same timeout (the hidden
// test flag).
func uniformConntrackTimeouts(d time.Duration) ConntrackTimeouts {
	return ConntrackTimeouts{TCPOpening: d, TCPEstablished: d, TCPClosing: d, Other: d}
}

// setConntrackTimeouts writes t into the program's timeout constants; a
// zero t leaves the declared defaults.
func setConntrackTimeouts(spec *ebpf.CollectionSpec, t ConntrackTimeouts) error {
	if t == (ConntrackTimeouts{}) {
		return nil
	}
	for name, d := range map[string]time.Duration{
		bpf.EnforceVarCtTimeoutTcpOpening:     t.TCPOpening,
		bpf.EnforceVarCtTimeoutTcpEstablished: t.TCPEstablished,
		bpf.EnforceVarCtTimeoutTcpClosing:     t.TCPClosing,
		bpf.EnforceVarCtTimeoutOther:          t.Other,
	} {
		v, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("set conntrack timeouts: program has no variable %s", name)
		}
		if err := v.Set(uint64(d)); err != nil {
			return fmt.Errorf("set conntrack timeout %s: %w", name, err)
		}
	}
	return nil
}

// ConntrackEntry is a conntrack map entry, decoded.
type ConntrackEntry struct {
	Endpoint, Remote netip.AddrPort
	Protocol         uint8
	// Ifindex is the device the connection was seen on.
	Ifindex uint32
	// Opening: the entry is in ct_opening (its origin has not spoken
	// after a reply yet).
	Opening bool
	// Origin is the direction that opened the connection.
	Origin uint8
	Flags  uint8
	// Expires is the CLOCK_MONOTONIC_COARSE time after which the entry is dead.
	Expires time.Duration
}

// conntrackGCBatch is how many entries one batch lookup reads. A hash map's
// batch lookup needs room for a whole bucket; buckets hold a handful.
const conntrackGCBatch = 4096

// conntrackGCRoundEntries bounds the work of one collection round: at most
// this many entries are read (and their expired ones deleted) per round,
// so that a full default map (262144) takes 4 rounds.
const conntrackGCRoundEntries = 65536

// ConntrackStats are the collector's counts of one map.
type ConntrackStats struct {
	// Entries is how many entries the last complete pass over the map
	// found alive (0 before the first pass ends).
	Entries uint64
	// MaxEntries is the map's size.
	MaxEntries uint32
	// Collected counts the expired entries deleted since start.
	Collected uint64
	// Passes counts complete passes over the map since start.
	Passes uint64
}

// conntrackGC deletes expired entries of the conntrack map, a bounded
// number of entries per round, continuing where the last round stopped.
type conntrackGC struct {
	log        *slog.Logger
	m          func() *ebpf.Map
	now        func() time.Duration
	roundLimit int

	mu     sync.Mutex // one round at a time
	cursor ebpf.MapBatchCursor
	live   uint64 // alive so far in this pass
	keys   []bpfmaps.ConntrackKey
	values []bpfmaps.ConntrackValue

	entries, collected, passes atomic.Uint64
}

func newConntrackGC(m func() *ebpf.Map, log *slog.Logger) *conntrackGC {
	return &conntrackGC{log: log, m: m, now: monotonicNow, roundLimit: conntrackGCRoundEntries,
		keys: make([]bpfmaps.ConntrackKey, conntrackGCBatch), values: make([]bpfmaps.ConntrackValue, conntrackGCBatch)}
}

// round reads up to roundLimit entries (one batch if that is more),
// deletes the expired ones and reports whether it finished a pass over the
// map. An entry refreshed by a packet between the read and the delete is
// deleted too (it had been idle for its whole timeout): its connection's
// next forward packet that policy allows creates it again.
//
// Possible errors: the map cannot be read or an entry cannot be deleted.
func (g *conntrackGC) round(ctx context.Context) (passDone bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.m()
	if m == nil {
		return false, nil
	}
	now := g.now()
	var expired []bpfmaps.ConntrackKey
	read := 0
	// A hash map's batch returns whole buckets, so it may hold fewer
	// entries than the buffer: a next batch is read only while a full one
	// still fits the round's limit, which thus is never exceeded.
	for ctx.Err() == nil && (read == 0 || read+len(g.keys) <= g.roundLimit) {
		n, err := m.BatchLookup(&g.cursor, g.keys, g.values, nil)
		for i := range n {
			if g.values[i].Expires() < now {
				expired = append(expired, g.keys[i])
			} else {
				g.live++
			}
		}
		read += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			passDone = true
			break
		}
		if err != nil {
			return false, fmt.Errorf("read conntrack map: %w", err)
		}
	}
	deleted, err := deleteConntrackKeys(m, expired)
	g.collected.Add(uint64(deleted))
	if err != nil {
		return false, err
	}
	if passDone {
		g.entries.Store(g.live)
		g.passes.Add(1)
		g.live = 0
		g.cursor = ebpf.MapBatchCursor{}
	}
	return passDone, nil
}

// deleteConntrackKeys deletes keys and returns how many it deleted; a key
// the LRU evicted meanwhile is not an error.
func deleteConntrackKeys(m *ebpf.Map, keys []bpfmaps.ConntrackKey) (int, error) {
	deleted := 0
	for len(keys) > 0 {
		n, err := m.BatchDelete(keys, nil)
		deleted += n
		if err == nil {
			break
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return deleted, fmt.Errorf("delete conntrack entries: %w", err)
		}
		// keys[n] is gone already: skip it.
		keys = keys[n+1:]
	}
	return deleted, nil
}

func (g *conntrackGC) stats(maxEntries uint32) ConntrackStats {
	return ConntrackStats{Entries: g.entries.Load(), MaxEntries: maxEntries,
		Collected: g.collected.Load(), Passes: g.passes.Load()}
}

// registerConntrackGC adds the collection job: a round every
// --conntrack-gc-interval.
func registerConntrackGC(cfg Config, d *Datapath, jobs job.Group) {
	var lastFull uint64
	jobs.Add(job.Timer("conntrack-gc", func(ctx context.Context) error {
		_, err := d.conntrackGC.round(ctx)
		if err == nil {
			_, err = d.openingGC.round(ctx)
		}
		if err != nil {
			return err
		}
		// Degraded while connections could not move since the last round,
		// or while the last complete pass found the map full (the next
		// one to become established will not move either).
		full, err := d.ConntrackFull()
		if err != nil {
			return nil // no program: nothing tracks
		}
		more := full - lastFull
		if full < lastFull {
			more = full // a new program counts from 0 again
		}
		lastFull = full
		established, _ := d.ConntrackStats()
		if more == 0 && (established.MaxEntries == 0 || established.Entries < uint64(established.MaxEntries)) {
			return nil
		}
		return fmt.Errorf("%w (max entries %d, %d live at the last pass; raise --conntrack-map-max-entries): "+
			"%d times since the last round an established connection could not move there and stayed in ct_opening",
			ErrConntrackFull, cfg.ConntrackMapMaxEntries, established.Entries, more)
	}, cfg.ConntrackGCInterval))
}

// sharedMap returns the datapath's own handle of the pinned map that which
// picks (unlike pinnedMap, no duplicate: for the collector's rounds,
// which stop with the maps), nil while the maps are not open.
func (d *Datapath) sharedMap(which func(*bpfmaps.Pinned) *ebpf.Map) *ebpf.Map {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.maps == nil {
		return nil
	}
	return which(d.maps)
}

// conntrackMap and conntrackOpeningMap return the pinned conntrack and
// ct_opening maps, nil while the maps are not open.
func (d *Datapath) conntrackMap() *ebpf.Map {
	return d.sharedMap(func(m *bpfmaps.Pinned) *ebpf.Map { return m.Conntrack })
}

func (d *Datapath) conntrackOpeningMap() *ebpf.Map {
	return d.sharedMap(func(m *bpfmaps.Pinned) *ebpf.Map { return m.ConntrackOpening })
}

// ConntrackStats returns the collector's counts and the map's size, of
// conntrack (established connections) and of ct_opening.
func (d *Datapath) ConntrackStats() (established, opening ConntrackStats) {
	var maxEntries, openingMax uint32
	if m := d.conntrackMap(); m != nil {
		maxEntries = m.MaxEntries()
	}
	if m := d.conntrackOpeningMap(); m != nil {
		openingMax = m.MaxEntries()
	}
	return d.conntrackGC.stats(maxEntries), d.openingGC.stats(openingMax)
}

// ConntrackFull counts the connections the program could not move to the
// conntrack map because it was full, summed over CPUs, since the program
// was loaded (they stay in ct_opening, where a flood of new connections
// can evict them).
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when the program's ct_stats cannot be read.
func (d *Datapath) ConntrackFull() (uint64, error) {
	d.mu.Lock()
	enf := d.enforcer
	d.mu.Unlock()
	if enf == nil {
		return 0, fmt.Errorf("read ct_stats: %w", ErrMapsNotOpen)
	}
	return enf.conntrackFull()
}

// conntrackFull sums the program's per-CPU count of failed moves to a
// full conntrack map.
//
// Possible errors: the kernel's, when ct_stats cannot be read.
func (e *enforcer) conntrackFull() (uint64, error) {
	var perCPU []uint64
	if err := e.ctStats.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read ct_stats: %w", err)
	}
	var total uint64
	for _, n := range perCPU {
		total += n
	}
	return total, nil
}

// Conntrack returns the entries of the conntrack map, expired ones
// included (until collected), and the CLOCK_MONOTONIC_COARSE time they were read
// at, to compare Expires with.
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when the map cannot be read.
func (d *Datapath) Conntrack() ([]ConntrackEntry, time.Duration, error) {
	established, opening := d.conntrackMap(), d.conntrackOpeningMap()
	if established == nil || opening == nil {
		return nil, 0, fmt.Errorf("read conntrack map: %w", ErrMapsNotOpen)
	}
	now := monotonicNow()
	var out []ConntrackEntry
	for _, m := range []*ebpf.Map{established, opening} {
		var k bpfmaps.ConntrackKey
		var v bpfmaps.ConntrackValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			endpoint, remote, protocol, err := k.Fields()
			if err != nil {
				continue // not the program's: skip it
			}
			out = append(out, ConntrackEntry{Endpoint: endpoint, Remote: remote, Protocol: protocol,
				Ifindex: binary.NativeEndian.Uint32(k[40:44]), Opening: m == opening,
				Origin: v.Origin(), Flags: v.Flags(), Expires: v.Expires()})
		}
		if err := it.Err(); err != nil {
			return nil, 0, fmt.Errorf("read conntrack map %s: %w", m, err)
		}
	}
	return out, now, nil
}

// FlushConntrack deletes every conntrack entry and returns how many it
// deleted. Replies of the flushed connections are then decided by policy
// until their next forward packet recreates the entry.
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when the map cannot be read or an entry deleted.
func (d *Datapath) FlushConntrack() (int, error) {
	established, opening := d.conntrackMap(), d.conntrackOpeningMap()
	if established == nil || opening == nil {
		return 0, fmt.Errorf("flush conntrack map: %w", ErrMapsNotOpen)
	}
	total := 0
	for _, m := range []*ebpf.Map{established, opening} {
		var keys []bpfmaps.ConntrackKey
		var k bpfmaps.ConntrackKey
		var v bpfmaps.ConntrackValue
		it := m.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			return total, fmt.Errorf("flush conntrack map: %w", err)
		}
		deleted, err := deleteConntrackKeys(m, keys)
		total += deleted
		if err != nil {
			return total, fmt.Errorf("flush conntrack map: %w", err)
		}
	}
	return total, nil
}

func conntrackFlags(def Config, flags *pflag.FlagSet) {
	flags.Uint32("conntrack-map-max-entries", def.ConntrackMapMaxEntries,
		"Maximum entries of the conntrack map of established connections (never evicted: when it is full, new connections stay in ct_opening, counted)")
	flags.Uint32("conntrack-opening-map-max-entries", def.ConntrackOpeningMapMaxEntries,
		"Maximum entries of the ct_opening map of connections not yet established (LRU: the least recently used are evicted when it is full)")
	flags.Duration("conntrack-gc-interval", def.ConntrackGCInterval, "Interval of the rounds that delete expired conntrack entries")
	flags.Duration("conntrack-test-timeout", def.ConntrackTestTimeout, "If set, every conntrack timeout is this (tests only)")
	// Hidden: for tests, not for users.
	_ = flags.MarkHidden("conntrack-gc-interval")
	_ = flags.MarkHidden("conntrack-test-timeout")
}

func (c Config) validateConntrack() error {
	switch {
	case c.ConntrackMapMaxEntries == 0:
		return fmt.Errorf("--conntrack-map-max-entries must be positive")
	case c.ConntrackOpeningMapMaxEntries == 0:
		return fmt.Errorf("--conntrack-opening-map-max-entries must be positive")
	case c.ConntrackGCInterval <= 0:
		return fmt.Errorf("--conntrack-gc-interval must be positive")
	case c.ConntrackTestTimeout < 0:
		return fmt.Errorf("--conntrack-test-timeout must not be negative")
	}
	return nil
}

// conntrackTimeouts are the program's timeouts: zero (its defaults) unless
// the test flag is set.
func (c Config) conntrackTimeouts() ConntrackTimeouts {
	if c.ConntrackTestTimeout == 0 {
		return ConntrackTimeouts{}
	}
	return uniformConntrackTimeouts(c.ConntrackTestTimeout)
}
