// SPDX-License-Identifier: Apache-2.0

// Command embed is a small "larger agent" that embeds ipcache-agent: it
// runs the project's cells (cells.ControlPlane) together with a cell of its
// own, podcell, which publishes pod IPs with identities allocated elsewhere.
// See README.md.
//
//	embed [flags]        run the agent (the ipcache-agent flags, plus --pods-file)
//	embed hive           print cells and objects
//	embed hive dot-graph print the object graph in graphviz dot format
//
// Exit codes: 0 clean stop (SIGTERM, SIGINT), 1 runtime failure, 2 bad flags
// or configuration.
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/examples/embed/podcell"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return agentcmd.Execute(newRootCommand(stdout, stderr), args, stderr)
}

// newRootCommand is the embed command, with the flags of every cell of its
// hive (readme_test.go checks README.md's flags against them).
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	// The embedding agent's hive: the project's cells, the shell server
	// (`ipcache-agent shell --shell-sock-path ...` talks to it) and its own.
	h := cells.NewHive(cells.ControlPlane, cells.Shell, podcell.Cell)
	return agentcmd.NewRootCommand(h, "embed",
		"Example agent embedding ipcache-agent, publishing pods with explicit identities",
		`embed runs ipcache-agent's cells and a cell of its own that publishes the pods
of --pods-file ("address identity" lines) into the ipcache with their
explicitly allocated identities, until SIGTERM or SIGINT.
Exit codes: 0 clean stop, 1 runtime failure, 2 bad flags or configuration.`,
		stdout, stderr)
}
