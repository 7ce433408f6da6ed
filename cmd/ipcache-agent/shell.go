// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive"
	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/cells"
)

// newShellCommand is `shell [command]`: with a command, it runs it and
// prints its output (an error once, on stderr, exit 1); without, it is
// hive's interactive shell on a terminal, and runs the commands piped
// into it otherwise (exit 1 if one failed). Each fails at once when no
// agent listens. Its --help lists the commands of the agent's shell, from
// h, the agent's hive (populated, not started: see listShellCommands).
func newShellCommand(stdout io.Writer, h *hive.Hive) *cobra.Command {
	cmd := shell.ShellCmd(cells.DefaultShellSockPath, "ipcache-agent> ", func(w io.Writer) {
		fmt.Fprintln(w, "ipcache-agent shell: 'help' lists the commands; db/show <table> shows a table.")
	})
	cmd.Short = "Talk to a running agent: statedb tables (db/...) and the agent's commands"
	help := cmd.HelpFunc()
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		help(c, args)
		listShellCommands(c.OutOrStdout(), h)
	})
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

// listShellCommands writes the name and summary of each command of the
// agent's shell, as the cells of h register them: a list kept by hand
// would miss the next command. Listing them populates h (constructors
// and Invokes run, as for `ipcache-agent hive`: they touch neither the
// kernel nor the disk) with the default configuration, and starts
// nothing.
func listShellCommands(w io.Writer, h *hive.Hive) {
	summaries, err := cells.ShellCommandSummaries(h, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintf(w, "\nThe shell's commands cannot be listed: %v\n", err)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nCommands of the agent's shell ('help <command>' on the shell for its usage):")
	for _, name := range slices.Sorted(maps.Keys(summaries)) {
		fmt.Fprintf(tw, "  %s\t%s\n", name, summaries[name])
	}
	tw.Flush()
}
