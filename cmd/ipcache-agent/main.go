// Command ipcache-agent runs the agent, and inspects it.
//
//	ipcache-agent [flags]        run the agent
//	ipcache-agent hive           print cells and objects
//	ipcache-agent hive dot-graph print the object graph in graphviz dot format
//	ipcache-agent shell [cmd]    talk to a running agent
//	ipcache-agent cleanup        detach programs, unpin maps and links, remove state
//
// Exit codes: 0 clean stop (SIGTERM, SIGINT), 1 runtime failure, 2 bad flags
// or configuration.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/cilium/hive"
	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"
	"go.uber.org/dig"

	"github.com/ipcache-agent/ipcache-agent/cells"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(cells.NewHive(cells.ControlPlane, cells.Shell), stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var usage usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "ipcache-agent: %s\nRun 'ipcache-agent --help' for usage.\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "ipcache-agent: %s\n", err)
	return exitFailure
}

// usageError is a bad flag, argument or configuration: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usageArgs makes an argument validation error a usageError.
func usageArgs(validate cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := validate(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

func newRootCommand(h *hive.Hive, stdout, stderr io.Writer) *cobra.Command {
	logging := cells.DefaultLogging
	root := &cobra.Command{
		Use:   "ipcache-agent",
		Short: "Map IP prefixes to security identities and enforce CIDR policy in BPF",
		Long: `ipcache-agent maps IP prefixes to numeric security identities in a pinned BPF
ipcache map and keeps the same numbers for the same prefixes across restarts.

Run without a command, it runs the agent until SIGTERM or SIGINT.
Exit codes: 0 clean stop, 1 runtime failure, 2 bad flags or configuration.`,
		Args:          usageArgs(cobra.NoArgs),
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRun: func(*cobra.Command, []string) {
			// The hive's own inspection commands log through the default.
			slog.SetDefault(logging.NewLogger(stderr))
		},
		RunE: func(*cobra.Command, []string) error {
			return runAgent(h, slog.Default())
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	logging.AddFlags(root.PersistentFlags())
	h.RegisterFlags(root.Flags())

	inspect := h.Command()
	inspect.Args = usageArgs(cobra.NoArgs)
	shellCmd := shell.ShellCmd(cells.DefaultShellSockPath, "ipcache-agent> ", func(w io.Writer) {
		fmt.Fprintln(w, "ipcache-agent shell: 'help' lists the commands; db/show <table> shows a table.")
	})
	shellCmd.Short = "Talk to a running agent: statedb tables (db/...) and the agent's commands"
	root.AddCommand(inspect, newCleanupCommand(stdout), shellCmd)
	return root
}

// runAgent runs the hive until a signal or a fatal error. A hive that cannot
// be built from its configuration is a usage error.
func runAgent(h *hive.Hive, log *slog.Logger) error {
	// What the agent creates (state files, the shell socket, pins) is for
	// root only.
	syscall.Umask(0o077)
	if err := h.Populate(log); err != nil {
		return usageError{fmt.Errorf("invalid configuration: %w", dig.RootCause(err))}
	}
	// Catch SIGTERM and SIGINT from here on, not only once the hive has
	// started (where hive.Run starts listening): a signal that arrives
	// during start then stops the hive cleanly right after it has started,
	// instead of killing the process.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case sig := <-signals:
			log.Info("Signal received, stopping", "signal", sig)
			h.Shutdown()
		case <-done:
		}
	}()

	if err := h.Run(log); err != nil {
		return fmt.Errorf("agent failed: %w", err)
	}
	return nil
}
