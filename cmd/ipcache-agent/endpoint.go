// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"strings"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
)

// newEndpointCommand is `endpoint list|get NAME`: the shell's endpoint
// commands run on the agent's socket (root only, as the shell).
func newEndpointCommand(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "endpoint",
		Short: "Show the endpoints: labels, identity, addresses, device, enforcement",
	}
	cmd.AddCommand(
		newShellQueryCommand(stdout, "list", "List the endpoints", endpointcell.ListCommand, cobra.NoArgs),
		newShellQueryCommand(stdout, "get NAMESPACE/NAME", "Show one endpoint", endpointcell.GetCommand, cobra.ExactArgs(1)),
	)
	return cmd
}

// newShellQueryCommand is a command that runs the shell command
// shellCmd with its arguments and -o on the agent's socket and prints
// what it answers.
func newShellQueryCommand(stdout io.Writer, use, short, shellCmd string, args cobra.PositionalArgs) *cobra.Command {
	var output, sockPath string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: func(_ *cobra.Command, args []string) error {
			line := append([]string{shellCmd, "-o", output}, args...)
			return cells.ShellExchange(sockPath, strings.Join(line, " "), stdout)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	cmd.Flags().StringVar(&sockPath, shell.ShellSockPathName, cells.DefaultShellSockPath, "Path to the agent's shell socket")
	return cmd
}
