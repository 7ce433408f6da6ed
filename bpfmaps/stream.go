// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"context"
	"iter"
)

// PinnedIPCache is the pinned ipcache map's entries as the datapath reads
// them once after its start, before anything writes to the map: the read
// that restore takes a block at a time, writing its rows for each block
// while the kernel reads the rest rather than after the whole map is read
// (docs/SCALE.md). The datapath provides it in every hive; it has one
// reader.
type PinnedIPCache interface {
	// Blocks yields the entries a block at a time as they are read, in
	// the kernel's order (address order among prefixes of one length),
	// each entry once, and ends after the last block; if the read fails,
	// it yields the error and ends. A block is yielded once: a second
	// range gets only what the first did not take. The blocks are shared
	// with the datapath: do not modify them.
	//
	// Possible errors (yielded): ctx's, when it ends before the read does
	// (the hive stopping, or its start failing); the map cannot be read
	// (wrapped).
	Blocks(ctx context.Context) iter.Seq2[[]IPCacheEntry, error]
}
