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
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

// stateFiles are the files the agent makes in the state directory.
var stateFiles = []string{
	identitycell.CheckpointFileName,
	identitycell.CheckpointFileName + ".corrupt",
	policycell.InForceFileName,
	policycell.InForceFileName + ".corrupt",
	"shell.sock",
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
checkpoint, saved policies in force, shell socket). After it, the next agent starts from nothing:
identity numbers are not restored. Do not run it while an agent is running.`,
		Args: agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			if err := datapathcell.Cleanup(bpfRoot); err != nil {
				return err
			}
			var errs []error
			for _, name := range stateFiles {
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
