// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
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
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/fqdncell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// defaultShellSockName is the socket cleanup removes from the state
// directory when --shell-sock-path is not given: with the default
// --state-dir it is the agent's default socket (cells.DefaultShellSockPath).
const defaultShellSockName = "shell.sock"

func newCleanupCommand(stdout io.Writer) *cobra.Command {
	bpfRoot := bpfmaps.DefaultRoot
	stateDir := statedir.DefaultConfig.StateDir
	var sockPath, output string
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach the enforcement program, unpin the maps and links, remove state files",
		Long: `cleanup removes everything a stopped agent leaves behind: it detaches the
enforcement program from every device, removes <bpf-root>/ipcache-agent/ (maps
and links), the files the agent made in the state directory (identity
checkpoint, saved policies in force, the record of the bpffs mount it made,
owner lock, the names learned from DNS), the DNS proxy's policy rule and
routes in this network namespace, and the shell socket an agent that did not stop cleanly leaves
behind (--shell-sock-path; by default <state-dir>/shell.sock, which with the
default --state-dir is the agent's default socket). After it, the next agent
starts from nothing: identity numbers are not restored.

The bpffs at --bpf-root is unmounted only when the agent mounted it (it
records that in the state directory) and nothing but the agent's pins was
in it; the directory goes too when the agent made it. A bpffs the agent did
not mount, or one that holds other pins, is left mounted, and the output
says so. A --bpf-root that is not a bpffs mount cannot hold pins: cleanup
says so and removes nothing there, and still removes the state files.

It prints one line for each thing it removed or left and why (-o json: one
object with the same facts). Exit 0 when nothing of the agent's is left,
whether it removed something or found nothing (cleaning what is clean, or a
--bpf-root that is not bpffs, succeeds: a script that runs cleanup to make
sure nothing is left needs no other check). While an agent owns the state
directory or the pins, or listens on the socket, cleanup refuses (exit 1),
naming the agent's pid or the socket; a --shell-sock-path that is not a
socket is left alone (exit 1); so is anything it fails to remove (exit 1).`,
		Args: agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			if output != "text" && output != "json" {
				return agentcmd.UsageError{Err: fmt.Errorf("-o %q: want text or json", output)}
			}
			report, err := cleanup(bpfRoot, stateDir, sockPath)
			if err != nil {
				return err
			}
			if output == "json" {
				encoder := json.NewEncoder(stdout)
				encoder.SetIndent("", "  ")
				return encoder.Encode(report)
			}
			report.writeText(stdout)
			return nil
		},
	}
	cmd.Flags().StringVar(&bpfRoot, "bpf-root", bpfRoot, "bpffs mount the agent pinned its maps and links under")
	cmd.Flags().StringVar(&stateDir, "state-dir", stateDir, "Directory of the agent's state")
	cmd.Flags().StringVar(&sockPath, "shell-sock-path", "",
		"Shell socket the agent listened on (default <state-dir>/shell.sock)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	return cmd
}

// cleanupReport is what cleanup removed and what it left, and why: the
// text lines and the -o json object say the same. Lists are never null.
type cleanupReport struct {
	BPFRoot string `json:"bpfRoot"`
	// BPFFS is whether --bpf-root is a bpffs mount: pins can be there only
	// if it is.
	BPFFS        bool     `json:"bpffs"`
	PinDir       string   `json:"pinDir"`
	RemovedMaps  []string `json:"removedMaps"`
	RemovedLinks []string `json:"removedLinks"`
	// DetachedFrom are the devices the enforcement program was detached
	// from.
	DetachedFrom []string `json:"detachedFrom"`
	// UnmountedBPFFS is whether the bpffs at --bpf-root, the agent's, was
	// unmounted; RemovedBPFRoot whether its directory, made by the agent,
	// was removed then.
	UnmountedBPFFS bool   `json:"unmountedBpffs"`
	RemovedBPFRoot bool   `json:"removedBpfRoot"`
	StateDir       string `json:"stateDir"`
	// RemovedStateFiles are the names of the files removed from the state
	// directory.
	RemovedStateFiles []string `json:"removedStateFiles"`
	// RemovedShellSockets are the paths of the shell socket and its lock
	// file, those that were there.
	RemovedShellSockets []string `json:"removedShellSockets"`
	// RemovedProxyRoutes is whether the DNS proxy's policy rule and local
	// routes (fwmark 0x200/0xf00, table 2004) were there and removed.
	RemovedProxyRoutes bool `json:"removedProxyRoutes"`
	// Left is what cleanup found and left, and why.
	Left []leftBehind `json:"left"`
}

// leftBehind is something cleanup left, and why.
type leftBehind struct {
	Path string `json:"path"`
	// What is leftMount or leftDirectory.
	What   string `json:"what"`
	Reason string `json:"reason"`
}

// What cleanup leaves: a bpffs mount, a directory.
const (
	leftMount     = "bpffsMount"
	leftDirectory = "directory"
)

// writeText writes the report, one line for each thing removed or left.
func (r cleanupReport) writeText(w io.Writer) {
	switch {
	case !r.BPFFS:
		fmt.Fprintf(w, "Nothing pinned under %s: not a bpffs mount\n", r.BPFRoot)
	case len(r.RemovedMaps)+len(r.RemovedLinks) == 0:
		fmt.Fprintf(w, "Nothing pinned in %s\n", r.PinDir)
	default:
		fmt.Fprintf(w, "Removed pins: %s (maps: %s; links: %s)\n", r.PinDir, listOrNone(r.RemovedMaps), listOrNone(r.RemovedLinks))
	}
	if len(r.DetachedFrom) > 0 {
		fmt.Fprintf(w, "Detached enforcement from: %s\n", strings.Join(r.DetachedFrom, ", "))
	}
	if r.UnmountedBPFFS {
		fmt.Fprintf(w, "Unmounted bpffs at %s (mounted by the agent)\n", r.BPFRoot)
	}
	if r.RemovedBPFRoot {
		fmt.Fprintf(w, "Removed directory %s (made by the agent)\n", r.BPFRoot)
	}
	if len(r.RemovedStateFiles) > 0 {
		fmt.Fprintf(w, "Removed state from %s: %s\n", r.StateDir, strings.Join(r.RemovedStateFiles, ", "))
	} else {
		fmt.Fprintf(w, "Nothing of the agent's in %s\n", r.StateDir)
	}
	for _, path := range r.RemovedShellSockets {
		fmt.Fprintf(w, "Removed %s\n", path)
	}
	if r.RemovedProxyRoutes {
		fmt.Fprintf(w, "Removed the DNS proxy's policy rule and routes (fwmark 0x200/0xf00, table 2004)\n")
	}
	for _, left := range r.Left {
		if left.What == leftMount {
			fmt.Fprintf(w, "Left %s mounted: %s\n", left.Path, left.Reason)
		} else {
			fmt.Fprintf(w, "Left %s %s: %s\n", left.What, left.Path, left.Reason)
		}
	}
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// kernelBPFFSFiles are what the kernel puts in every bpffs mount it makes
// (the bpf_preload iterators): not pins of anybody's.
var kernelBPFFSFiles = []string{"maps.debug", "progs.debug"}

// cleanup removes what a stopped agent of bpfRoot, stateDir and sockPath
// (empty: <stateDir>/shell.sock) left, and reports it.
//
// Possible errors: an agent owns the state directory or the pins, or
// listens on the socket (ErrOwned, errShellSocketInUse); sockPath is not a
// socket (errNotASocket); something cannot be removed or unmounted.
func cleanup(bpfRoot, stateDir, sockPath string) (cleanupReport, error) {
	report := cleanupReport{BPFRoot: bpfRoot, PinDir: bpfmaps.PinDir(bpfRoot), StateDir: stateDir,
		RemovedMaps: []string{}, RemovedLinks: []string{}, DetachedFrom: []string{},
		RemovedStateFiles: []string{}, RemovedShellSockets: []string{}, Left: []leftBehind{}}
	bpffs, err := bpfmaps.IsBPFFS(bpfRoot)
	if err != nil {
		return report, fmt.Errorf("cleanup: --bpf-root %s: cannot tell whether it is a bpffs mount: %w", bpfRoot, err)
	}
	report.BPFFS = bpffs
	// Lock only what exists: cleanup creates nothing, and without a pin
	// directory on a bpffs mount there is nothing an agent owns there.
	lockState, lockPins := stateDir, bpfRoot
	if !exists(stateDir) {
		lockState = ""
	}
	if !bpffs || !exists(bpfmaps.PinDir(bpfRoot)) {
		lockPins = ""
	}
	// cleanup makes the lock file if it was not there: only one the agent
	// left is reported removed.
	lockLeft := exists(filepath.Join(stateDir, cells.OwnerLockFileName))
	owner, err := cells.AcquireOwner(lockState, "")
	if err != nil {
		return report, fmt.Errorf("cleanup: %w", err)
	}
	defer owner.Release()
	// Locked apart from the state directory: the lock, an open descriptor
	// of the pin directory, is given up before the bpffs is unmounted,
	// which it would keep busy.
	pinsOwner, err := cells.AcquireOwner("", lockPins)
	if err != nil {
		return report, fmt.Errorf("cleanup: %w", err)
	}
	defer pinsOwner.Release()
	if sockPath == "" {
		sockPath = filepath.Join(stateDir, defaultShellSockName)
	}
	// Checked before anything is removed: a live socket is another
	// agent's (this state directory's is locked), and a path that is
	// not a socket is a mistake in the flag, not the agent's file.
	if err := checkShellSocket(sockPath); err != nil {
		return report, fmt.Errorf("cleanup: %w", err)
	}
	stateFiles, err := declaredStateFiles()
	if err != nil {
		return report, fmt.Errorf("cleanup: %w", err)
	}
	// Read before the state files (it is one) are removed.
	mount, recorded, err := cells.ReadBPFFSMount(stateDir)
	if err != nil {
		return report, fmt.Errorf("cleanup: %w", err)
	}
	if bpffs {
		removed, err := bpfmaps.Cleanup(bpfRoot)
		report.RemovedMaps = append(report.RemovedMaps, removed.Maps...)
		report.RemovedLinks = append(report.RemovedLinks, removed.Links...)
		report.DetachedFrom = append(report.DetachedFrom, removed.Devices...)
		if err != nil {
			return report, err
		}
		if err := pinsOwner.Release(); err != nil {
			return report, fmt.Errorf("cleanup: %w", err)
		}
		if err := report.unmountAgentsBPFFS(mount, recorded); err != nil {
			return report, fmt.Errorf("cleanup: %w", err)
		}
	}
	var errs []error
	// The DNS proxy's policy rule and routes, in this network namespace
	// (the agent's, when cleanup runs where the agent ran).
	if removed, err := fqdncell.RemoveProxyRoutes(); err != nil {
		errs = append(errs, err)
	} else {
		report.RemovedProxyRoutes = removed
	}
	for _, path := range []string{sockPath, sockPath + cells.ShellLockSuffix} {
		if removed, err := remove(path); err != nil {
			errs = append(errs, err)
		} else if removed {
			report.RemovedShellSockets = append(report.RemovedShellSockets, path)
		}
	}
	// The lock file goes last, while it is still locked: an agent that
	// starts meanwhile is refused rather than locking a new one.
	for _, name := range append(stateFiles, cells.BPFFSMountFileName, cells.OwnerLockFileName) {
		if removed, err := remove(filepath.Join(stateDir, name)); err != nil {
			errs = append(errs, err)
		} else if removed && (name != cells.OwnerLockFileName || lockLeft) {
			report.RemovedStateFiles = append(report.RemovedStateFiles, name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return report, fmt.Errorf("cleanup: %w", err)
	}
	return report, nil
}

// unmountAgentsBPFFS unmounts the bpffs at the report's --bpf-root when
// the agent recorded mounting it there (mount, recorded) and it holds
// nothing but what the kernel puts in every bpffs, and removes the
// directory when the agent made it; otherwise it adds to Left why the
// mount stays.
//
// Possible errors: the mount cannot be read or unmounted.
func (r *cleanupReport) unmountAgentsBPFFS(mount cells.BPFFSMount, recorded bool) error {
	root := filepath.Clean(r.BPFRoot)
	if !recorded || filepath.Clean(mount.Path) != root {
		r.Left = append(r.Left, leftBehind{Path: r.BPFRoot, What: leftMount, Reason: "not mounted by the agent"})
		return nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("list the bpffs at %s: %w", root, err)
	}
	var others []string
	for _, entry := range entries {
		if !slices.Contains(kernelBPFFSFiles, entry.Name()) {
			others = append(others, entry.Name())
		}
	}
	if len(others) > 0 {
		r.Left = append(r.Left, leftBehind{Path: r.BPFRoot, What: leftMount,
			Reason: "mounted by the agent, but it holds pins other than the agent's (" + strings.Join(others, ", ") + ")"})
		return nil
	}
	if err := unix.Unmount(root, 0); err != nil {
		return fmt.Errorf("unmount the bpffs the agent mounted at %s: %w", root, err)
	}
	r.UnmountedBPFFS = true
	if !mount.CreatedDir {
		return nil
	}
	if err := os.Remove(root); err != nil {
		r.Left = append(r.Left, leftBehind{Path: r.BPFRoot, What: leftDirectory, Reason: "made by the agent, but: " + err.Error()})
		return nil
	}
	r.RemovedBPFRoot = true
	return nil
}

// remove removes path and reports whether it was there.
//
// Possible errors: those of the removal but ENOENT.
func remove(path string) (bool, error) {
	err := os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
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
// wherever --shell-sock-path put it, the owner lock, which cleanup
// holds while it works and removes last, and the owner's record of the
// bpffs it mounted (cells.BPFFSMountFileName) are not among them. The cells
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
