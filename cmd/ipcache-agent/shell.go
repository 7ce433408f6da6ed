// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/cells"
)

// newShellCommand is `shell [command]`: with a command, it runs it and
// prints its output (an error once, on stderr, exit 1); without, it is
// hive's interactive shell on a terminal, and runs the commands piped
// into it otherwise (exit 1 if one failed). Each fails at once when no
// agent listens.
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
		// Not a terminal: hive's shell would fail to make it raw.
		if in := c.InOrStdin(); !isTerminal(in) {
			return cells.ShellScript(sockPath, in, stdout, c.ErrOrStderr())
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

// isTerminal reports whether r is a terminal (it has termios).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
