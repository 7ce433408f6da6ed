// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/cells"
)

// newShellCommand is `shell [command]`: with a command, it runs it and
// prints its output (an error once, on stderr, exit 1); without, it is
// hive's interactive shell. Either fails at once when no agent listens.
func newShellCommand(stdout io.Writer) *cobra.Command {
	cmd := shell.ShellCmd(cells.DefaultShellSockPath, "ipcache-agent> ", func(w io.Writer) {
		fmt.Fprintln(w, "ipcache-agent shell: 'help' lists the commands; db/show <table> shows a table.")
	})
	cmd.Short = "Talk to a running agent: statedb tables (db/...) and the agent's commands"
	// Flags after the command are the command's (db/show --format=json).
	cmd.Flags().SetInterspersed(false)
	interactive := cmd.Run
	cmd.Run = nil
	cmd.RunE = func(c *cobra.Command, args []string) error {
		sockPath, err := c.Flags().GetString(shell.ShellSockPathName)
		if err != nil {
			return err
		}
		if len(args) > 0 {
			return cells.ShellExchange(sockPath, strings.Join(args, " "), stdout)
		}
		conn, err := cells.DialShell(sockPath)
		if err != nil {
			return err
		}
		conn.Close()
		interactive(c, args)
		return nil
	}
	return cmd
}
