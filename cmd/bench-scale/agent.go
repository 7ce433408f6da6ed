// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// agent is one run of the agent's cells (what one agent process runs, less
// the shell and metrics) over a bpffs and state directory that outlive it.
type agent struct {
	hive     *hive.Hive
	log      *slog.Logger
	db       *statedb.DB
	ipcache  *ipcachecell.IPCache
	entries  statedb.Table[*ipcachecell.Entry]
	datapath *datapathcell.Datapath
	restorer *restorecell.Restorer

	// ownerDone marks the benchmark's owner done as a producer; nil if
	// the agent has no owner.
	ownerDone func()
}

type agentConfig struct {
	bpfRoot, stateDir string
	maxEntries        uint32
	gracePeriod       time.Duration
	// withOwner registers the owner as a producer before start: the
	// `ipcache` table is then initialized only after it re-asserted its
	// prefixes, as a real owner's would be.
	withOwner bool
}

// startAgent builds and starts an agent; it returns once the start hooks
// (restore among them) have run.
func startAgent(cfg agentConfig, log *slog.Logger) (*agent, error) {
	a := &agent{log: log}
	a.hive = cells.NewHive(
		identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell, restorecell.Cell,
		cell.Invoke(func(db *statedb.DB, c *ipcachecell.IPCache, e statedb.Table[*ipcachecell.Entry],
			d *datapathcell.Datapath, r *restorecell.Restorer) {
			a.db, a.ipcache, a.entries, a.datapath, a.restorer = db, c, e, d, r
			if cfg.withOwner {
				a.ownerDone = c.RegisterProducer(ownerResource)
			}
		}),
	)
	hive.AddConfigOverride(a.hive, func(c *statedir.Config) { c.StateDir = cfg.stateDir })
	hive.AddConfigOverride(a.hive, func(c *datapathcell.Config) {
		c.BPFRoot = cfg.bpfRoot
		c.IPCacheMapMaxEntries = cfg.maxEntries
	})
	hive.AddConfigOverride(a.hive, func(c *restorecell.Config) { c.IdentityRestoreGracePeriod = cfg.gracePeriod })
	if err := a.hive.Start(log, context.Background()); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	return a, nil
}

func (a *agent) stop() error {
	if err := a.hive.Stop(a.log, context.Background()); err != nil {
		return fmt.Errorf("stop agent: %w", err)
	}
	return nil
}

// waitFor polls cond until it holds, or fails after the deadline.
func waitFor(what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// waitReconciled waits until the ipcache map's reconciler has handled n
// keys since start: written, or skipped because the map held the value.
func (a *agent) waitReconciled(n uint64, timeout time.Duration) error {
	return waitFor(fmt.Sprintf("%d ipcache map keys reconciled", n), timeout, func() bool {
		written, unchanged := a.datapath.MapWrites(bpfmaps.IPCacheName)
		return written+unchanged >= n
	})
}

// waitInitialized waits until the `ipcache` table is initialized.
func (a *agent) waitInitialized(timeout time.Duration) error {
	_, initialized := a.entries.Initialized(a.db.ReadTxn())
	select {
	case <-initialized:
		return nil
	case <-time.After(timeout):
		return errors.New("timed out waiting for the ipcache table to be initialized")
	}
}

// heapPerPrefix returns the heap in use beyond heapBefore, per prefix of
// n, once the ipcache map's first prune is over: the heap the agent keeps,
// not what it holds until then (right after the table is initialized,
// the reconciler's copy of the map's content, which the prune uses and
// drops).
func (a *agent) heapPerPrefix(heapBefore int64, n int) (float64, error) {
	if err := waitFor("the first prune of the ipcache map", convergeTimeout, func() bool {
		return a.datapath.Prunes(bpfmaps.IPCacheName) > 0
	}); err != nil {
		return 0, err
	}
	return float64(heapInUse()-heapBefore) / float64(n), nil
}
