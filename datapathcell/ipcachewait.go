// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"

	"github.com/cilium/statedb"
)

// WaitIPCacheWritten blocks until the ipcache writer has written (or
// failed to write) every change of the `ipcache` table up to revision
// rev: an entry is written only after the policy entries of its identity
// (make before break), so a caller that waits for its prefixes' entries
// knows that the program allows what policy allows for them. Without a
// writer (no maps) there is nothing to wait for.
//
// Possible errors: ctx's.
func (d *Datapath) WaitIPCacheWritten(ctx context.Context, rev statedb.Revision) error {
	if d.ipcacheWriter == nil {
		return nil
	}
	_, _, err := d.ipcacheWriter.WaitUntilReconciled(ctx, rev)
	return err
}
