// SPDX-License-Identifier: Apache-2.0

package datapathcell

import "github.com/ipcache-agent/ipcache-agent/bpfmaps"

// PinnedSnapshot is what the ipcache map's writer keeps of the read of the
// pinned map (its entries in address order), once the read has ended.
func PinnedSnapshot(d *Datapath) []bpfmaps.IPCacheEntry {
	<-d.snapshotTaken
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.snapshot.Entries
}
