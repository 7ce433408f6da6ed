// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"fmt"
	"iter"
	"sync"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

// pinnedIPCacheStream is the pinned ipcache map's entries as the Datapath
// reads them after its start (bpfmaps.PinnedIPCache).
type pinnedIPCacheStream struct {
	mu sync.Mutex
	// blocks are those read and not yet taken.
	blocks [][]bpfmaps.IPCacheEntry
	// more is closed when a block comes or the read ends, then replaced.
	more  chan struct{}
	ended bool
	err   error
}

var _ bpfmaps.PinnedIPCache = (*pinnedIPCacheStream)(nil)

func newPinnedIPCacheStream() *pinnedIPCacheStream {
	return &pinnedIPCacheStream{more: make(chan struct{})}
}

// pinnedIPCache provides the Datapath's read of the pinned ipcache map.
func pinnedIPCache(d *Datapath) bpfmaps.PinnedIPCache { return d.stream }

// publish adds a block read.
func (s *pinnedIPCacheStream) publish(block []bpfmaps.IPCacheEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blocks = append(s.blocks, block)
	close(s.more)
	s.more = make(chan struct{})
}

// end ends the stream, with the read's error if it failed.
func (s *pinnedIPCacheStream) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended, s.err = true, err
	close(s.more)
}

// Blocks implements bpfmaps.PinnedIPCache.
func (s *pinnedIPCacheStream) Blocks(ctx context.Context) iter.Seq2[[]bpfmaps.IPCacheEntry, error] {
	return func(yield func([]bpfmaps.IPCacheEntry, error) bool) {
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
