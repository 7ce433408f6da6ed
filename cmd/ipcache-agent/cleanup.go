// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// defaultShellSockName is the socket cleanup removes from the state
// directory when --shell-sock-path is not given: with the default
// --state-dir it is the agent's default socket (cells.DefaultShellSockPath).
const defaultShellSockName = "shell.sock"

func newCleanupCommand(stdout io.Writer) *cobra.Command {
	bpfRoot := bpfmaps.DefaultRoot
	stateDir := statedir.DefaultConfig.StateDir
	var sockPath string
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach the enforcement program, unpin the maps and links, remove state files",
		Long: `cleanup removes everything a stopped agent leaves behind: it detaches the
enforcement program from every device, removes <bpf-root>/ipcache-agent/ (maps
and links), the files the agent made in the state directory (identity
checkpoint, saved policies in force, owner lock) and the shell socket an
agent that did not stop cleanly leaves behind (--shell-sock-path; by default
<state-dir>/shell.sock, which with the default --state-dir is the agent's
default socket). After it, the next agent starts from nothing: identity
numbers are not restored. While an agent owns the state directory or the
pins, or listens on the socket, cleanup refuses (exit 1), naming the
agent's pid or the socket; a --shell-sock-path that is not a socket is
left alone (exit 1).`,
		Args: agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			// Lock only what exists: cleanup creates nothing, and without a pin
			// directory (or a bpffs mount) there is nothing an agent owns there.
			lockState, lockPins := stateDir, bpfRoot
			if !exists(stateDir) {
				lockState = ""
			}
			if !exists(bpfmaps.PinDir(bpfRoot)) {
				lockPins = ""
			}
			owner, err := cells.AcquireOwner(lockState, lockPins)
			if err != nil {
				return fmt.Errorf("cleanup: %w", err)
			}
			defer owner.Release()
			if sockPath == "" {
				sockPath = filepath.Join(stateDir, defaultShellSockName)
			}
			// Checked before anything is removed: a live socket is another
			// agent's (this state directory's is locked), and a path that is
			// not a socket is a mistake in the flag, not the agent's file.
			if err := checkShellSocket(sockPath); err != nil {
				return fmt.Errorf("cleanup: %w", err)
			}
			stateFiles, err := declaredStateFiles()
			if err != nil {
				return fmt.Errorf("cleanup: %w", err)
			}
			if err := bpfmaps.Cleanup(bpfRoot); err != nil {
				return err
			}
			var errs []error
			for _, path := range []string{sockPath, sockPath + cells.ShellLockSuffix} {
				if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			// The lock file goes last, while it is still locked: an agent that
			// starts meanwhile is refused rather than locking a new one.
			for _, name := range append(stateFiles, cells.OwnerLockFileName) {
				if err := os.Remove(filepath.Join(stateDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("cleanup: %w", err)
			}
			fmt.Fprintf(stdout, "Removed %s and the agent's state in %s\n",
				filepath.Join(bpfRoot, "ipcache-agent"), stateDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&bpfRoot, "bpf-root", bpfRoot, "bpffs mount the agent pinned its maps and links under")
	cmd.Flags().StringVar(&stateDir, "state-dir", stateDir, "Directory of the agent's state")
	cmd.Flags().StringVar(&sockPath, "shell-sock-path", "",
		"Shell socket the agent listened on (default <state-dir>/shell.sock)")
	return cmd
}

// checkShellSocket returns nil when path does not exist or is a socket
// nothing listens on, which cleanup may remove.
//
// Possible errors: errShellSocketInUse when an agent listens on path,
// errNotASocket when path is anything but a socket, and lstat's.
func checkShellSocket(path string) error {
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check shell socket (--shell-sock-path): %w", err)
	}
	if info.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("remove shell socket %s (--shell-sock-path): %w", path, errNotASocket)
	}
	conn, err := cells.DialShell(path)
	if err != nil {
		return nil // a socket left behind
	}
	conn.Close()
	return fmt.Errorf("remove shell socket %s (--shell-sock-path): %w", path, errShellSocketInUse)
}

// declaredStateFiles returns the names of the files the agent's cells
// declare in the state directory (statedir.Files), each followed by its
// set-aside copy, in the order of the names: the shell socket, which is
// wherever --shell-sock-path put it, and the owner lock, which cleanup
// holds while it works and removes last, are not among them. The cells
// are built but not started, as for `hive`: nothing is touched.
//
// Possible errors: building the agent's cells fails.
func declaredStateFiles() ([]string, error) {
	var declared []statedir.File
	h := cells.NewHive(cells.ControlPlane, cell.Invoke(func(f statedir.Files) { declared = f.Files }))
	if err := h.Populate(slog.New(slog.DiscardHandler)); err != nil {
		return nil, fmt.Errorf("list the state files the cells declare: %w", err)
	}
	slices.SortFunc(declared, func(a, b statedir.File) int { return strings.Compare(a.Name, b.Name) })
	var names []string
	for _, f := range declared {
		names = append(names, f.Name, statedir.AsideName(f.Name))
	}
	return names, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
