// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
)

// newEndpointCommand is `endpoint list|get NAMESPACE/NAME`: the shell's
// endpoint/list and endpoint/get, run on the agent's socket.
func newEndpointCommand(stdout io.Writer) *cobra.Command {
	return newListGetCommand(stdout, listGet{
		noun:      "endpoint",
		short:     "Show the running agent's endpoints: labels, identity, addresses, device, enforcement",
		listShort: "List the endpoints",
		listCmd:   endpointcell.ListCommand,
		getUse:    "get NAMESPACE/NAME",
		getShort:  "Show one endpoint (a name without a namespace is in default)",
		getCmd:    endpointcell.GetCommand,
		validate: func(arg string) error {
			ns, name, found := strings.Cut(arg, "/")
			if !found {
				ns, name = endpoint.DefaultNamespace, arg
			}
			if endpoint.ValidateName(ns, 63) != nil || endpoint.ValidateName(name, 253) != nil {
				return agentcmd.UsageError{Err: fmt.Errorf("endpoint %q: want namespace/name", arg)}
			}
			return nil
		},
	})
}

// listGet describes a `<noun> list|get ARG` command over two shell
// commands of the running agent.
type listGet struct {
	noun, short              string
	listShort, listCmd       string
	getUse, getShort, getCmd string
	validate                 func(arg string) error
}

// newListGetCommand returns the command: its subcommands run the shell
// commands with -o on the agent's socket (root only, as the shell) and
// print what the agent answers; a bad -o or argument exits 2.
func newListGetCommand(stdout io.Writer, c listGet) *cobra.Command {
	cmd := &cobra.Command{
		Use:   c.noun,
		Short: c.short,
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			return agentcmd.UsageError{Err: errors.New(c.noun + " needs a command: list or get")}
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
		Short: c.listShort,
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE:  func(*cobra.Command, []string) error { return run(c.listCmd) },
	}
	get := &cobra.Command{
		Use:   c.getUse,
		Short: c.getShort,
		Args:  agentcmd.UsageArgs(cobra.ExactArgs(1)),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := c.validate(args[0]); err != nil {
				return err
			}
			return run(c.getCmd + " " + args[0])
		},
	}
	for _, sub := range []*cobra.Command{list, get} {
		sub.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
		sub.Flags().StringVar(&sockPath, shell.ShellSockPathName, cells.DefaultShellSockPath, "Path to the agent's shell socket")
	}
	cmd.AddCommand(list, get)
	return cmd
}
