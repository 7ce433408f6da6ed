// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"sync"
	"time"
)

const (
	// walkSpacing: after a walk that took d, the next is not before
	// walkSpacing times d has passed, so that walks take at most about
	// 1% of a core however often scrapes come.
	walkSpacing = 100
	// cheapWalk: a walk quicker than this is done again whenever what it
	// reads changed. A table of a few thousand rows is then never
	// reported stale; only large ones are spaced.
	cheapWalk = time.Millisecond
)

// Walked is a value a collector computes by walking a table (counting its
// rows by some property), kept between scrapes. A scrape walks again only
// when what the walk reads changed since the last one (its key: a table's
// revision, or what else the value depends on), and then, when the last
// walk took longer than a millisecond, only once walkSpacing times that
// long has passed since it began: until then it gets the last value.
//
// A client that scrapes several times a second while a table of a
// million rows changes (a load, a harness polling for its end) would
// otherwise keep a core busy walking it, taking the CPU from the writers
// whose progress it watches (docs/SCALE.md, "The scrapes' walks"). The
// price is a value up to walkSpacing times a walk's duration old while
// such a table changes; a table that stopped changing is reported as it
// is at the next scrape.
//
// The zero value is ready to use. It is safe for concurrent use: a scrape
// that comes while another walks waits for its value.
type Walked[K comparable, T any] struct {
	mu        sync.Mutex
	valid     bool
	key       K
	value     T
	notBefore time.Time
}

// Get returns the value for key: the one kept if it was computed for key,
// or if the last walk was too long for another yet; else walk's, which it
// keeps. Read the key from the snapshot walk reads, or from before it: a
// change after the key was read is then seen at a later scrape, never
// missed.
func (w *Walked[K, T]) Get(key K, walk func() T) T {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	if w.valid && (w.key == key || start.Before(w.notBefore)) {
		return w.value
	}
	w.value, w.key, w.valid = walk(), key, true
	w.notBefore = start
	if took := time.Since(start); took > cheapWalk {
		w.notBefore = start.Add(walkSpacing * took)
	}
	return w.value
}
