// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
)

// newIdentityCommand is `identity list|get N`: the shell's identity/list
// and identity/get, run on the agent's socket (root only, as the shell).
func newIdentityCommand(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "identity",
		Short: "Show the running agent's identities, their labels and users",
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			return agentcmd.UsageError{Err: errors.New("identity needs a command: list or get")}
		},
	}
	var output, sockPath string
	run := func(command string) error {
		if output != "text" && output != "json" {
			return agentcmd.UsageError{Err: fmt.Errorf("-o %s: want text or json", output)}
		}
		return cells.ShellExchange(sockPath, fmt.Sprintf("%s -o %s", command, output), stdout)
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the allocated identities (local and label) with their references and users",
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE:  func(*cobra.Command, []string) error { return run("identity/list") },
	}
	get := &cobra.Command{
		Use:   "get N",
		Short: "Show identity N: labels, references, whether withheld, its users",
		Args:  agentcmd.UsageArgs(cobra.ExactArgs(1)),
		RunE: func(_ *cobra.Command, args []string) error {
			if _, err := strconv.ParseUint(args[0], 10, 32); err != nil {
				return agentcmd.UsageError{Err: fmt.Errorf("identity %q: want a number", args[0])}
			}
			return run("identity/get " + args[0])
		},
	}
	for _, sub := range []*cobra.Command{list, get} {
		sub.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
		sub.Flags().StringVar(&sockPath, shell.ShellSockPathName, cells.DefaultShellSockPath, "Path to the agent's shell socket")
	}
	cmd.AddCommand(list, get)
	return cmd
}
