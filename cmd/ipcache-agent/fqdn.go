// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
)

// newFQDNCommand is `fqdn cache list`: the shell's fqdn/cache-list, run on
// the agent's socket (root only, as the shell).
func newFQDNCommand(stdout io.Writer) *cobra.Command {
	fqdnCmd := &cobra.Command{
		Use:   "fqdn",
		Short: "Show what the running agent's DNS proxy learned (toFQDNs)",
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			return agentcmd.UsageError{Err: errors.New("fqdn needs a command: cache")}
		},
	}
	cacheCmd := &cobra.Command{
		Use:   "cache",
		Short: "The names learned from DNS answers",
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			return agentcmd.UsageError{Err: errors.New("fqdn cache needs a command: list")}
		},
	}
	var output, sockPath string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the names learned from DNS, their addresses, expiry, identity and the endpoint that resolved them",
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			if output != "text" && output != "json" {
				return agentcmd.UsageError{Err: fmt.Errorf("-o %s: want text or json", output)}
			}
			return cells.ShellExchange(sockPath, "fqdn/cache-list -o "+output, stdout)
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	list.Flags().StringVar(&sockPath, shell.ShellSockPathName, cells.DefaultShellSockPath, "Path to the agent's shell socket")
	cacheCmd.AddCommand(list)
	fqdnCmd.AddCommand(cacheCmd)
	return fqdnCmd
}
