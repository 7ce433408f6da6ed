// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/monitorcell"
)

// newMonitorCommand is `monitor`: it runs the shell's monitor command on
// the agent's socket (root only, as the shell) and prints its events until
// interrupted.
func newMonitorCommand(stdout io.Writer) *cobra.Command {
	var typ, output, sockPath string
	cmd := &cobra.Command{
		Use:   monitorcell.Command,
		Short: "Stream the enforcement program's drop and verdict events (as cilium-dbg monitor)",
		Long: "Streams one line per event until interrupted: --type drop (default), verdict\n" +
			"(allowed packets) or all; -o json prints one JSON object per line\n" +
			"(docs/CONTRACT.md \"Monitor events\").",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return cells.ShellExchange(sockPath, fmt.Sprintf("%s --type=%s -o %s", monitorcell.Command, typ, output), stdout)
		},
	}
	cmd.Flags().StringVar(&typ, "type", "drop", "Events: drop, verdict or all")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	cmd.Flags().StringVar(&sockPath, shell.ShellSockPathName, cells.DefaultShellSockPath, "Path to the agent's shell socket")
	return cmd
}
