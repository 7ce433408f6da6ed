package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

// stateFiles are the files the agent makes in the state directory, but for
// the owner lock, which cleanup holds while it works and removes last.
var stateFiles = []string{
	identitycell.CheckpointFileName,
	identitycell.CheckpointFileName + ".corrupt",
	policycell.InForceFileName,
	policycell.InForceFileName + ".corrupt",
	"shell.sock",
	"shell.sock" + cells.ShellLockSuffix,
}

func newCleanupCommand(stdout io.Writer) *cobra.Command {
	bpfRoot := datapathcell.DefaultConfig.BPFRoot
	stateDir := identitycell.DefaultConfig.StateDir
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach the enforcement program, unpin the maps and links, remove state files",
		Long: `cleanup removes everything a stopped agent leaves behind: it detaches the
enforcement program from every device, removes <bpf-root>/ipcache-agent/ (maps
and links) and the files the agent made in the state directory (identity
checkpoint, saved policies in force, shell socket, owner lock). After it,
the next agent starts from nothing: identity numbers are not restored.
While an agent owns the state directory or the pins, cleanup refuses (exit
1), naming the agent's pid.`,
		Args: agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			// Lock only what exists: cleanup creates nothing, and without a pin
			// directory (or a bpffs mount) there is nothing an agent owns there.
			lockState, lockPins := stateDir, bpfRoot
			if !exists(stateDir) {
				lockState = ""
			}
			if !exists(datapathcell.PinDir(bpfRoot)) {
				lockPins = ""
			}
			owner, err := cells.AcquireOwner(lockState, lockPins)
			if err != nil {
				return fmt.Errorf("cleanup: %w", err)
			}
			defer owner.Release()
			if err := datapathcell.Cleanup(bpfRoot); err != nil {
				return err
			}
			var errs []error
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
	return cmd
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
