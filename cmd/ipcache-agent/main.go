// SPDX-License-Identifier: Apache-2.0

// Command ipcache-agent runs the agent, and inspects it.
//
//	ipcache-agent [flags]        run the agent
//	ipcache-agent hive           print cells and objects
//	ipcache-agent hive dot-graph print the object graph in graphviz dot format
//	ipcache-agent shell [cmd]    talk to a running agent
//	ipcache-agent cleanup        detach programs, unpin maps and links, remove state
//	ipcache-agent policy validate FILE...  check policy files offline
//	ipcache-agent version      print the build and the BPF program's tags
//
// Exit codes: 0 clean stop (SIGTERM, SIGINT; SIGHUP is ignored), 1 runtime failure, 2 bad flags
// or configuration.
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	return agentcmd.Execute(newRootCommand(stdout, stderr), args, stderr)
}

// newRootCommand is the agent's command line, every subcommand included.
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	h := cells.NewHive(cells.ControlPlane, cells.Shell)
	root := agentcmd.NewRootCommand(h,
		"ipcache-agent",
		"Map IP prefixes to security identities and enforce CIDR policy in BPF",
		`ipcache-agent maps IP prefixes to numeric security identities in a pinned BPF
ipcache map and keeps the same numbers for the same prefixes across restarts.

Run without a command, it runs the agent until SIGTERM or SIGINT.
Exit codes: 0 clean stop, 1 runtime failure, 2 bad flags or configuration.`,
		stdout, stderr)
	root.AddCommand(newCleanupCommand(stdout), newShellCommand(stdout, h), newPolicyCommand(stdout), newVersionCommand(stdout), newMonitorCommand(stdout))
	root.AddCommand(newEndpointCommand(stdout))
	root.AddCommand(newIdentityCommand(stdout))
	root.AddCommand(newFQDNCommand(stdout))
	return root
}
