// SPDX-License-Identifier: Apache-2.0

package identitycell

// The Checkpointer: reads the previous checkpoint at start, and writes the
// checkpoint as the `identities` table changes.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

const (
	// defaultCheckpointInterval is the shortest time between two checkpoint
	// writes: changes in between are coalesced into one write.
	defaultCheckpointInterval = 200 * time.Millisecond

	// maxCheckpointRetryInterval bounds the backoff between failed writes.
	maxCheckpointRetryInterval = 30 * time.Second
)

// probeWritable creates and removes a temporary file in dir, named as the
// checkpoint's temporary files are (so that one a crash leaves behind is
// removed at the next start).
func probeWritable(dir string) error {
	probe, err := os.CreateTemp(dir, atomicfile.TempPattern(CheckpointFileName))
	if err != nil {
		return err
	}
	return errors.Join(probe.Close(), os.Remove(probe.Name()))
}

// Checkpointer keeps <state-dir>/local-identities.json in step with the
// `identities` table, and keeps what the previous run saved for restore.
type Checkpointer struct {
	db       *statedb.DB
	table    statedb.Table[*Identity]
	log      *slog.Logger
	path     string // empty: checkpointing is off
	interval time.Duration

	// previous is what the previous run saved, once previousDecoded is
	// closed: Start reads the file and decodes it in the background.
	// ForgetPrevious empties it, under previousMu.
	previousMu      sync.Mutex
	previous        Checkpoint
	previousDecoded chan struct{}
}

func newCheckpointer(db *statedb.DB, table statedb.Table[*Identity], log *slog.Logger, stateDir string) *Checkpointer {
	c := &Checkpointer{db: db, table: table, log: log, interval: defaultCheckpointInterval,
		previous: Checkpoint{}, previousDecoded: make(chan struct{})}
	if stateDir != "" {
		c.path = filepath.Join(stateDir, CheckpointFileName)
	} else {
		close(c.previousDecoded)
	}
	return c
}

// identities lists the allocated identities of a snapshot in number
// order, counting them in n (a row without references, which only a tool
// builds, has nothing to keep).
func (c *Checkpointer) identities(txn statedb.ReadTxn, n *int) iter.Seq2[identity.Number, labels.Labels] {
	return func(yield func(identity.Number, labels.Labels) bool) {
		for ident := range c.table.All(txn) {
			if !ident.Allocated() {
				continue
			}
			*n++
			if !yield(ident.ID, ident.Labels) {
				return
			}
		}
	}
}

// Previous returns what the previous run checkpointed. It waits until the
// Checkpointer's start hook has read it and the decoding that follows is
// done. A reader in a start hook of its own (restore) depends on the
// Checkpointer, whose hook is appended when it is constructed, so the hive
// runs that hook first; the wait states the dependency, and would end with
// ctx rather than hang were the order broken. The checkpoint is shared: do
// not modify it. After ForgetPrevious, it is empty.
//
// Possible errors: ctx's, when it ends first (the hive stopping, or its
// start failing, before the checkpoint was read).
func (c *Checkpointer) Previous(ctx context.Context) (Checkpoint, error) {
	select {
	case <-c.previousDecoded:
		c.previousMu.Lock()
		defer c.previousMu.Unlock()
		return c.previous, nil
	case <-ctx.Done():
		return Checkpoint{}, fmt.Errorf("wait for the previous identity checkpoint: %w", ctx.Err())
	}
}

// ForgetPrevious drops what the previous run checkpointed, once restore
// has used it: a million identities' labels that the agent would
// otherwise keep for as long as it runs (docs/SCALE.md, "What a restart
// keeps"). The file itself is replaced by the next checkpoint.
func (c *Checkpointer) ForgetPrevious() {
	c.previousMu.Lock()
	defer c.previousMu.Unlock()
	c.previous = Checkpoint{}
}

// Start implements cell.HookInterface: it prepares the state directory and
// reads the previous checkpoint, which it decodes in the background
// (Previous waits for it): decoding a million identities then overlaps
// the datapath's start (reading the pinned map). What can make the start
// fail is found first: an unusable state directory, a checkpoint that
// cannot be read. A corrupt checkpoint is
// moved aside (with suffix .corrupt) and treated as empty: restore then
// falls back to the cidr labels of the pinned entries.
//
// Possible errors: the errors of creating the state directory, of writing
// a file in it, and of reading the checkpoint (wrapped, each naming
// --state-dir). Never ErrCorruptCheckpoint.
func (c *Checkpointer) Start(cell.HookContext) error {
	if c.path == "" {
		return nil
	}
	dir := filepath.Dir(c.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory %s (--state-dir): %w", dir, err)
	}
	if err := atomicfile.RemoveTemps(c.path); err != nil {
		c.log.Warn("Cannot remove stale checkpoint temporary files", "dir", dir, "error", err)
	}
	// Find out now, not at the first checkpoint, that the directory is not
	// writable: an agent that cannot checkpoint would lose the labels of
	// its identities at the next restart.
	if err := probeWritable(dir); err != nil {
		return fmt.Errorf("probe state directory %s (--state-dir): it is not writable, so the identity checkpoint cannot be saved "+
			"(make it writable or choose another --state-dir): %w", dir, err)
	}
	data, err := readCheckpointFile(c.path)
	if err != nil {
		return fmt.Errorf("read identity checkpoint (--state-dir %s): %w", dir, err)
	}
	go func() {
		defer close(c.previousDecoded)
		previous, err := decodeCheckpoint(c.path, data)
		if err != nil { // ErrCorruptCheckpoint: decoding fails with nothing else
			aside, moveErr := statedir.SetAside(c.path)
			c.log.Error("Identity checkpoint is corrupt; moved aside, restoring without its labels",
				"path", c.path, "moved-to", aside, "error", err)
			if err := moveErr; err != nil {
				// The next checkpoint replaces it: only the evidence is lost.
				c.log.Error("Cannot move the corrupt identity checkpoint aside", "path", c.path, "error", err)
			}
			return
		}
		c.log.Info("Read identity checkpoint", "path", c.path, "identities", previous.Len())
		c.previousMu.Lock()
		c.previous = previous
		c.previousMu.Unlock()
	}()
	return nil
}

// Stop implements cell.HookInterface: the write loop, a job, writes the
// last checkpoint.
//
// Possible errors: none.
func (c *Checkpointer) Stop(cell.HookContext) error { return nil }

// run writes the checkpoint whenever the table changes, at most once per
// interval, and once more when stopping. It waits until the table is
// initialized so that the previous run's checkpoint is not replaced by a
// partial one before restore has re-allocated its identities.
func (c *Checkpointer) run(ctx context.Context, health cell.Health) error {
	if c.path == "" {
		health.OK("Checkpointing off (no state directory)")
		return nil
	}
	for {
		initialized, initWatch := c.table.Initialized(c.db.ReadTxn())
		if initialized {
			break
		}
		health.OK("Waiting for identities to be initialized")
		select {
		case <-ctx.Done():
			return nil
		case <-initWatch:
		}
	}

	// Rows change on every reference, and only a row that is new or gone
	// changes the checkpoint (an identity's labels never change: a number
	// is freed, then allocated anew). But a row seen here for the first
	// time may already hold several references (a shared identity whose
	// holders came in one transaction), so every change counts: the
	// writes stay bounded by the interval and the fifth of the time below.
	txn := c.db.WriteTxn(c.table)
	changes, err := c.table.Changes(txn)
	txn.Commit()
	if err != nil {
		return fmt.Errorf("observe identities: %w", err)
	}
	defer changes.Close()
	// The first write happens even when nothing changed, so that the file
	// exists (and is known writable) from the first run on.
	dirty := true
	var (
		failures  int    // consecutive failed writes
		lastError string // logged once until it changes
	)
	for {
		// Whatever was committed before the stop is in this last read.
		stopping := ctx.Err() != nil
		snapshot := c.db.ReadTxn()
		changed, watch := changes.Next(snapshot)
		for range changed {
			dirty = true
		}
		wait := c.interval
		if dirty {
			start := time.Now()
			var written int
			err := writeCheckpoint(c.path, c.identities(snapshot, &written))
			if err != nil {
				failures++
				if err.Error() != lastError {
					c.log.Error("Cannot write identity checkpoint, will retry", "error", err)
					lastError = err.Error()
				}
				health.Degraded("Cannot write identity checkpoint", err)
				// Retry with backoff: a read-only or full disk does not
				// heal in 200 ms.
				wait = min(c.interval<<min(failures, 8), maxCheckpointRetryInterval)
			} else {
				if failures > 0 {
					c.log.Info("Identity checkpoint written again", "after-failures", failures)
				}
				failures, lastError, dirty = 0, "", false
				health.OK(fmt.Sprintf("Checkpointed %d identities", written))
			}
			// Spend at most a fifth of the time writing: a million
			// identities take a while to write.
			wait = max(wait, 4*time.Since(start))
		}
		if stopping {
			return nil
		}
		if !dirty {
			select {
			case <-ctx.Done():
			case <-watch:
			}
		}
		// Coalesce a burst of changes into one write.
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
