package identitycell

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/labels"
)

const (
	// CheckpointFileName is the checkpoint's name in the state directory.
	CheckpointFileName = "local-identities.json"

	checkpointVersion = 1

	// checkpointTempPattern names the temporary files a checkpoint is
	// written to before it is renamed into place. A crash can leave one
	// behind, half-written; it is never read, and removed at the next start.
	checkpointTempPattern = "." + CheckpointFileName + ".tmp-*"

	// defaultCheckpointInterval is the shortest time between two checkpoint
	// writes: changes in between are coalesced into one write.
	defaultCheckpointInterval = 200 * time.Millisecond
)

// ErrCorruptCheckpoint is returned (wrapped) for a checkpoint file that
// cannot be decoded.
var ErrCorruptCheckpoint = errors.New("corrupt identity checkpoint")

// Checkpoint is the saved number -> labels of the local identities.
type Checkpoint map[NumericIdentity]labels.Labels

type checkpointFile struct {
	Version    int                  `json:"version"`
	Identities []checkpointIdentity `json:"identities"`
}

type checkpointIdentity struct {
	ID     NumericIdentity `json:"id"`
	Labels labels.Labels   `json:"labels"`
}

// ReadCheckpoint reads the checkpoint at path. A missing file is an empty
// checkpoint: the agent has not run before.
//
// Possible errors: ErrCorruptCheckpoint (wrapped), and errors reading the
// file.
func ReadCheckpoint(path string) (Checkpoint, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read identity checkpoint: %w", err)
	}
	return decodeCheckpoint(path, data)
}

func decodeCheckpoint(path string, data []byte) (Checkpoint, error) {
	var file checkpointFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrCorruptCheckpoint, path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w %s: trailing data", ErrCorruptCheckpoint, path)
	}
	if file.Version != checkpointVersion {
		return nil, fmt.Errorf("%w %s: version %d, want %d", ErrCorruptCheckpoint, path, file.Version, checkpointVersion)
	}
	checkpoint := make(Checkpoint, len(file.Identities))
	for _, entry := range file.Identities {
		if !entry.ID.IsLocal() || entry.Labels.IsEmpty() {
			return nil, fmt.Errorf("%w %s: entry %d %q is not a local identity with labels",
				ErrCorruptCheckpoint, path, entry.ID, entry.Labels)
		}
		if _, dup := checkpoint[entry.ID]; dup {
			return nil, fmt.Errorf("%w %s: identity %d listed twice", ErrCorruptCheckpoint, path, entry.ID)
		}
		checkpoint[entry.ID] = entry.Labels
	}
	return checkpoint, nil
}

// writeCheckpoint replaces the checkpoint at path atomically: it writes a
// temporary file in the same directory, syncs it, renames it over path and
// syncs the directory. A reader sees the old or the new file, never a part.
func writeCheckpoint(path string, checkpoint Checkpoint) error {
	file := checkpointFile{Version: checkpointVersion, Identities: make([]checkpointIdentity, 0, len(checkpoint))}
	for _, id := range slices.Sorted(maps.Keys(checkpoint)) {
		file.Identities = append(file.Identities, checkpointIdentity{ID: id, Labels: checkpoint[id]})
	}
	data, err := json.MarshalIndent(file, "", " ")
	if err != nil {
		return fmt.Errorf("encode identity checkpoint: %w", err)
	}

	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, checkpointTempPattern)
	if err != nil {
		return fmt.Errorf("write identity checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	_, err = tmp.Write(append(data, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("write identity checkpoint %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeStaleTemps removes temporary files that a crash left behind.
func removeStaleTemps(dir string) error {
	stale, err := filepath.Glob(filepath.Join(dir, checkpointTempPattern))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range stale {
		errs = append(errs, os.Remove(name))
	}
	return errors.Join(errs...)
}

// Checkpointer keeps <state-dir>/local-identities.json in step with the
// `identities` table, and keeps what the previous run saved for restore.
type Checkpointer struct {
	db       *statedb.DB
	table    statedb.Table[*Identity]
	log      *slog.Logger
	path     string // empty: checkpointing is off
	interval time.Duration

	mu       sync.Mutex
	previous Checkpoint
}

func newCheckpointer(db *statedb.DB, table statedb.Table[*Identity], log *slog.Logger, stateDir string) *Checkpointer {
	c := &Checkpointer{db: db, table: table, log: log, interval: defaultCheckpointInterval, previous: Checkpoint{}}
	if stateDir != "" {
		c.path = filepath.Join(stateDir, CheckpointFileName)
	}
	return c
}

// Path returns the checkpoint file's path, or "" if checkpointing is off.
func (c *Checkpointer) Path() string { return c.path }

// Previous returns what the previous run checkpointed. It is read when the
// hive starts, before the first write; before that it is empty.
func (c *Checkpointer) Previous() Checkpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.previous)
}

// Start implements cell.HookInterface: it prepares the state directory and
// reads the previous checkpoint. A corrupt checkpoint is moved aside (with
// suffix .corrupt) and treated as empty: restore then falls back to the cidr
// labels of the pinned entries.
func (c *Checkpointer) Start(cell.HookContext) error {
	if c.path == "" {
		return nil
	}
	dir := filepath.Dir(c.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	if err := removeStaleTemps(dir); err != nil {
		c.log.Warn("Cannot remove stale checkpoint temporary files", "error", err)
	}
	previous, err := ReadCheckpoint(c.path)
	switch {
	case errors.Is(err, ErrCorruptCheckpoint):
		aside := c.path + ".corrupt"
		c.log.Error("Identity checkpoint is corrupt; moved aside, restoring without its labels",
			"error", err, "moved-to", aside)
		if err := os.Rename(c.path, aside); err != nil {
			return fmt.Errorf("move corrupt identity checkpoint aside: %w", err)
		}
		previous = Checkpoint{}
	case err != nil:
		return err
	default:
		c.log.Info("Read identity checkpoint", "path", c.path, "identities", len(previous))
	}
	c.mu.Lock()
	c.previous = previous
	c.mu.Unlock()
	return nil
}

// Stop implements cell.HookInterface.
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

	// The first write happens even when nothing changed, so that the file
	// exists (and is known writable) from the first run on.
	var written Checkpoint
	for {
		// Whatever was committed before the stop is in this last read.
		stopping := ctx.Err() != nil
		iter, watch := c.table.AllWatch(c.db.ReadTxn())
		current := Checkpoint{}
		for identity := range iter {
			current[identity.ID] = identity.Labels
		}
		failed := false
		if written == nil || !maps.Equal(current, written) {
			if err := writeCheckpoint(c.path, current); err != nil {
				c.log.Error("Cannot write identity checkpoint, will retry", "error", err)
				health.Degraded("Cannot write identity checkpoint", err)
				failed = true
			} else {
				written = current
				health.OK(fmt.Sprintf("Checkpointed %d identities", len(current)))
			}
		}
		if stopping {
			return nil
		}
		if !failed {
			select {
			case <-ctx.Done():
			case <-watch:
			}
		}
		// Coalesce a burst of changes into one write.
		select {
		case <-ctx.Done():
		case <-time.After(c.interval):
		}
	}
}
