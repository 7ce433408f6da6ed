// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// PreviousNumber is a prefix and the number its identity had in the
// previous run, when that identity was the prefix's cidr label alone.
type PreviousNumber struct {
	Prefix netip.Prefix
	Number identity.Number
}

// previousNumbers is what restore told the ipcache of the previous run
// without writing a row per prefix: the number each prefix had, which the
// resolver requests for it when no row requests one, as restore's row
// did. A restart re-asserts nearly every prefix: a row per prefix beside
// the owner's was a million upserts, and as many merges and resolutions,
// that only repeated what the owner's rows then said (docs/SCALE.md,
// "What restore's rows cost the restart").
//
// Without a row, nothing would keep a restored prefix whose owner removes
// it during the grace period: the resolver keeps its entry instead, and
// tells restore (the orphans), which writes a row for it.
type previousNumbers struct {
	mu sync.RWMutex
	// index is, for each prefix told, its place in told; nil once
	// forgotten (the grace period is over).
	index map[compactPrefix]int32
	told  []previousNumber
	// orphans are the prefixes whose entries the resolver kept when their
	// last row went; restore takes them.
	orphans []PreviousNumber
	// orphaned has a value while orphans has prefixes.
	orphaned chan struct{}
}

// previousNumber is a told prefix's number, and whether the resolver has
// written its entry: restore speaks for the others (PreviousWithoutEntry)
// without a lookup per prefix in the `ipcache` table, which cost as much
// as a tenth of a restart's CPU at a million prefixes.
type previousNumber struct {
	number identity.Number
	// resolved is set by the resolver once the prefix has an entry. It is
	// never cleared while the prefix is told: the resolver keeps the
	// entry of a told prefix whose rows go (keep).
	resolved atomic.Bool
}

func newPreviousNumbers() *previousNumbers {
	return &previousNumbers{orphaned: make(chan struct{}, 1)}
}

// AddPrevious tells the ipcache the numbers of the previous run's prefixes
// (restore, as it reads the pinned map, each number withheld first): a
// prefix in batch whose rows request no number gets its previous one, if
// it is free, as if restore had a row for it; and its entry is kept when
// its last row goes, until [IPCache.ForgetPrevious] (see
// [IPCache.Orphans]). A prefix added twice keeps the later number.
//
// Possible errors: none.
func (c *IPCache) AddPrevious(batch []PreviousNumber) {
	p := c.previous
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.index == nil {
		p.index = make(map[compactPrefix]int32, len(batch))
	}
	p.told = slices.Grow(p.told, len(batch))
	for _, pn := range batch {
		key := compact(pn.Prefix.Masked())
		if i, had := p.index[key]; had {
			p.told[i].number = pn.Number
			continue
		}
		p.index[key] = int32(len(p.told))
		p.told = append(p.told, previousNumber{number: pn.Number})
	}
}

// Orphans returns a channel that has a value while prefixes told by
// [IPCache.AddPrevious] lost their last row and kept their entries: the
// caller then takes them ([IPCache.TakeOrphans]) and writes a row for
// each, which the resolver resolves to the same identity.
func (c *IPCache) Orphans() <-chan struct{} { return c.previous.orphaned }

// TakeOrphans returns the prefixes whose entries were kept when their last
// row went, since the last call.
func (c *IPCache) TakeOrphans() []PreviousNumber {
	p := c.previous
	p.mu.Lock()
	defer p.mu.Unlock()
	orphans := p.orphans
	p.orphans = nil
	select {
	case <-p.orphaned:
	default:
	}
	return orphans
}

// ForgetPrevious ends what [IPCache.AddPrevious] told: no number is
// requested for a prefix from now on, and no entry is kept. It returns
// the orphans not taken yet, whose entries are still kept: the caller
// writes their rows, or their entries stay without one.
func (c *IPCache) ForgetPrevious() []PreviousNumber {
	p := c.previous
	p.mu.Lock()
	defer p.mu.Unlock()
	orphans := p.orphans
	p.index, p.told, p.orphans = nil, nil, nil
	return orphans
}

// PreviousWithoutEntry returns the prefixes told by [IPCache.AddPrevious]
// that have no entry: no row ever asked for them, or their rows went
// before they were resolved; in no order (UpsertBatch sorts). Restore
// writes a row for each once every other producer has spoken and been
// resolved.
func (c *IPCache) PreviousWithoutEntry() []PreviousNumber {
	p := c.previous
	p.mu.RLock()
	defer p.mu.RUnlock()
	var missing []PreviousNumber
	for key, i := range p.index {
		if t := &p.told[i]; !t.resolved.Load() {
			missing = append(missing, PreviousNumber{Prefix: key.prefix(), Number: t.number})
		}
	}
	return missing
}

// lookupLocked returns the place of the prefix among the told ones, or
// -1. Called by the resolver's read, with mu read-locked.
func (p *previousNumbers) lookupLocked(prefix netip.Prefix) int32 {
	if i, ok := p.index[compact(prefix)]; ok {
		return i
	}
	return -1
}

// keep reports whether the entry of a prefix whose last row went is kept,
// and records the prefix as an orphan if so. Called by the resolver, in
// its write transaction.
func (p *previousNumbers) keep(prefix netip.Prefix) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, told := p.index[compact(prefix)]
	if !told {
		return false
	}
	p.orphans = append(p.orphans, PreviousNumber{Prefix: prefix, Number: p.told[i].number})
	select {
	case p.orphaned <- struct{}{}:
	default:
	}
	return true
}
