// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/job"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

// gcBatch is how many entries one batch lookup reads. A hash map's batch
// lookup needs room for a whole bucket; buckets hold a handful.
const gcBatch = 4096

// gcRoundEntries bounds the work of one collection round: at most this
// many entries are read (and their expired ones deleted) per round, so
// that a full default map (262144) takes 4 rounds.
const gcRoundEntries = 65536

// Stats are the collector's counts of one map.
type Stats struct {
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

// collector deletes expired entries of a conntrack map, a bounded number
// of entries per round, continuing where the last round stopped.
type collector struct {
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

func newCollector(m func() *ebpf.Map, log *slog.Logger) *collector {
	return &collector{log: log, m: m, now: bpfmaps.MonotonicNow, roundLimit: gcRoundEntries,
		keys: make([]bpfmaps.ConntrackKey, gcBatch), values: make([]bpfmaps.ConntrackValue, gcBatch)}
}

// round reads up to roundLimit entries (one batch if that is more),
// deletes the expired ones and reports whether it finished a pass over the
// map. An entry refreshed by a packet between the read and the delete is
// deleted too (it had been idle for its whole timeout): its connection's
// next forward packet that policy allows creates it again.
//
// Possible errors: the map cannot be read or an entry cannot be deleted.
func (g *collector) round(ctx context.Context) (passDone bool, err error) {
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
	deleted, err := deleteKeys(m, expired)
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

// deleteKeys deletes keys and returns how many it deleted; a key the LRU
// evicted meanwhile is not an error.
func deleteKeys(m *ebpf.Map, keys []bpfmaps.ConntrackKey) (int, error) {
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

func (g *collector) stats(maxEntries uint32) Stats {
	return Stats{Entries: g.entries.Load(), MaxEntries: maxEntries,
		Collected: g.collected.Load(), Passes: g.passes.Load()}
}

// registerGC adds the collection job: a round every
// --conntrack-gc-interval.
func registerGC(cfg Config, t *Tracker, jobs job.Group) {
	var lastFull uint64
	jobs.Add(job.Timer("conntrack-gc", func(ctx context.Context) error {
		_, err := t.established.round(ctx)
		if err == nil {
			_, err = t.opening.round(ctx)
		}
		if err != nil {
			return err
		}
		// Degraded while connections could not move since the last round,
		// or while the last complete pass found the map full (the next
		// one to become established will not move either).
		full, err := t.Full()
		if err != nil {
			return nil // no program: nothing tracks
		}
		more := full - lastFull
		if full < lastFull {
			more = full // a new program counts from 0 again
		}
		lastFull = full
		established, _ := t.Stats()
		if more == 0 && (established.MaxEntries == 0 || established.Entries < uint64(established.MaxEntries)) {
			return nil
		}
		return fmt.Errorf("%w (max entries %d, %d live at the last pass; raise --conntrack-map-max-entries): "+
			"%d times since the last round an established connection could not move there and stayed in ct_opening",
			ErrMapFull, cfg.ConntrackMapMaxEntries, established.Entries, more)
	}, cfg.ConntrackGCInterval))
}
