package cells

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/shell"
)

// DefaultShellSockPath is where the agent's shell listens.
const DefaultShellSockPath = "/run/ipcache-agent/shell.sock"

// Shell serves the hive shell (statedb's db/... commands and the cells'
// commands) on the --shell-sock-path UNIX socket, for `ipcache-agent
// shell`. The socket is for root only: its directory is made mode 0700
// before the server listens, and the socket is made 0600 once it exists.
var Shell = cell.Group(
	// Before shell.ServerCell, so that this start hook runs before its
	// listener job.
	cell.Invoke(privateShellDir),
	shell.ServerCell(DefaultShellSockPath),
)

func privateShellDir(cfg shell.Config, lc cell.Lifecycle, jobs job.Registry, health cell.Health) {
	if cfg.ShellSockPath == "" {
		return
	}
	// The server creates the socket in a job of its own; its mode is set
	// when it appears. The 0700 directory keeps others out meanwhile.
	jobs.NewGroup(health).Add(job.OneShot("shell-socket-mode", func(ctx context.Context, _ cell.Health) error {
		for {
			if err := os.Chmod(cfg.ShellSockPath, 0o600); err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
	}))
	lc.Append(cell.Hook{OnStart: func(cell.HookContext) error {
		dir := filepath.Dir(cfg.ShellSockPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("shell socket directory: %w", err)
		}
		// An existing directory may have been made with a wider mode.
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("shell socket directory: %w", err)
		}
		// A socket left by a previous run would get the mode instead of
		// the new one (the server replaces it when it listens).
		if err := os.Remove(cfg.ShellSockPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale shell socket: %w", err)
		}
		return nil
	}})
}
