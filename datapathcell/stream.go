// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"fmt"
	"iter"
	"sync"
)

// PinnedIPCacheStream is the pinned ipcache map's entries as the
// Datapath reads them after its start, for one reader: restore, which
// writes its rows for each block while the kernel reads the rest, rather
// than after the whole map is read (docs/SCALE.md).
type PinnedIPCacheStream struct {
	mu sync.Mutex
	// blocks are those read and not yet taken.
	blocks [][]PinnedEntry
	// more is closed when a block comes or the read ends, then replaced.
	more  chan struct{}
	ended bool
	err   error
	taken bool
}

// StreamPinnedIPCache makes the Datapath's start return before the pinned
// ipcache map is read, and returns the stream of its entries. Call it
// before start (from a constructor or an invoke), at most once. The caller
// takes over what the start did with the read's error: it must read the
// stream to its end in a start hook of its own, after the Datapath's, and
// fail that start if the read fails.
//
// Possible errors: ErrStreamTaken, on a second call or after start.
func (d *Datapath) StreamPinnedIPCache() (*PinnedIPCacheStream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stream != nil || d.maps != nil {
		return nil, ErrStreamTaken
	}
	d.stream = &PinnedIPCacheStream{more: make(chan struct{})}
	return d.stream, nil
}

// publish adds a block read.
func (s *PinnedIPCacheStream) publish(block []PinnedEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blocks = append(s.blocks, block)
	close(s.more)
	s.more = make(chan struct{})
}

// end ends the stream, with the read's error if it failed.
func (s *PinnedIPCacheStream) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended, s.err = true, err
	close(s.more)
}

// Blocks yields the entries a block at a time as they are read, in the
// kernel's order (address order among prefixes of one length; each
// block's entries once sorted are the snapshot's order), each entry once,
// and ends after the last block; if the read fails, it yields the error
// and ends. It can be ranged over once. The blocks are shared with the
// snapshot: do not modify them.
//
// Possible errors (yielded): ctx's, when it ends before the read does
// (the hive stopping, or its start failing); the map cannot be read
// (wrapped); ErrStreamTaken, when ranged over a second time.
func (s *PinnedIPCacheStream) Blocks(ctx context.Context) iter.Seq2[[]PinnedEntry, error] {
	return func(yield func([]PinnedEntry, error) bool) {
		s.mu.Lock()
		taken := s.taken
		s.taken = true
		s.mu.Unlock()
		if taken {
			yield(nil, ErrStreamTaken)
			return
		}
		for {
			s.mu.Lock()
			blocks, more, ended, err := s.blocks, s.more, s.ended, s.err
			s.blocks = nil // taken: the stream keeps no block alive
			s.mu.Unlock()
			for _, block := range blocks {
				if !yield(block, nil) {
					return
				}
			}
			if len(blocks) > 0 {
				continue // more may have come meanwhile
			}
			if ended {
				if err != nil {
					yield(nil, err)
				}
				return
			}
			select {
			case <-more:
			case <-ctx.Done():
				yield(nil, fmt.Errorf("wait for the pinned ipcache map's entries: %w", ctx.Err()))
				return
			}
		}
	}
}
