// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

const (
	// startGCPercent is the garbage collector's target (GOGC) while the
	// agent fills its tables and writes the ipcache map at start: the
	// heap grows from nothing to its steady size then, and at the default
	// the collector marks the growing heap again at every doubling
	// (docs/SCALE.md, issue 21, "GC policy"). The cost is more memory
	// during the start, and after it until the runtime returns the excess.
	startGCPercent = 200
	// defaultGCPercent is Go's default GOGC, set again after the start.
	defaultGCPercent = 100
)

// startGC raises GOGC from the datapath's start until the ipcache map
// holds what the `ipcache` table said when it was initialized (every
// producer had spoken and was resolved), or until the datapath stops.
// Nothing is changed when GOGC is set in the environment: the operator's
// choice stands. The setting is the process's: agents that start at once
// in one process (tests) may end each other's raise early, which only
// makes a start slower.
type startGC struct {
	raised atomic.Bool
	once   sync.Once
}

func (g *startGC) raise() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	g.raised.Store(true)
	debug.SetGCPercent(startGCPercent)
}

func (g *startGC) end() {
	g.once.Do(func() {
		if g.raised.Load() {
			debug.SetGCPercent(defaultGCPercent)
		}
	})
}

// endAfterStart is a job: it waits until the `ipcache` table is initialized
// and the ipcache map's writer has reconciled it as it was then, and ends
// the raise.
func (g *startGC) endAfterStart(db *statedb.DB, table statedb.Table[*ipcachecell.Entry],
	writer reconciler.Reconciler[*ipcachecell.Entry]) func(context.Context, cell.Health) error {
	return func(ctx context.Context, _ cell.Health) error {
		defer g.end()
		_, initialized := table.Initialized(db.ReadTxn())
		select {
		case <-ctx.Done():
			return nil
		case <-initialized:
		}
		// An error is ctx's: the datapath stops, and the raise ends.
		_, _, _ = writer.WaitUntilReconciled(ctx, table.Revision(db.ReadTxn()))
		return nil
	}
}
