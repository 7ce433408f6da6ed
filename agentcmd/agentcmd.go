// Package agentcmd is the command line of an agent built from the
// project's cells: ipcache-agent's own, and that of a larger agent that
// embeds the cells (examples/embed). It runs the hive until SIGTERM or
// SIGINT (caught from the process's first moments; SIGHUP and SIGPIPE do
// not stop it: see package stopsignal), inspects it (`hive`, `hive
// dot-graph`), sets up logging (--log-level, --log-format), sets flags from
// the environment and maps errors to exit codes.
package agentcmd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"

	"github.com/cilium/hive"
	"github.com/spf13/cobra"
	"go.uber.org/dig"

	"github.com/ipcache-agent/ipcache-agent/agentcmd/stopsignal"
	"github.com/ipcache-agent/ipcache-agent/cells"
)

// Exit codes.
const (
	ExitOK      = 0 // clean stop
	ExitFailure = 1 // runtime failure
	ExitUsage   = 2 // bad flags, arguments or configuration
)

// UsageError is a bad flag, argument or configuration: exit code 2.
type UsageError struct{ Err error }

// Error returns the underlying error's message.
func (e UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e UsageError) Unwrap() error { return e.Err }

// UsageArgs makes an argument validation error a UsageError.
func UsageArgs(validate cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := validate(cmd, args); err != nil {
			return UsageError{err}
		}
		return nil
	}
}

// NewRootCommand returns the root command of an agent: without a
// subcommand it runs the hive; `hive` and `hive dot-graph` inspect it. The
// hive's flags and the logging flags are registered; flag errors are
// UsageErrors. Every flag of the command that runs, its subcommands'
// included, can also be set in the environment (see envName); the command
// line wins. use, short and long are the command's usage texts.
func NewRootCommand(h *hive.Hive, use, short, long string, stdout, stderr io.Writer) *cobra.Command {
	logging := cells.DefaultLogging
	root := &cobra.Command{
		Use:           use,
		Short:         short,
		Long:          long,
		Args:          UsageArgs(cobra.NoArgs),
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if cmd != cmd.Root() {
				// Only the agent itself keeps the signals caught.
				stopsignal.Release()
			}
			if err := setFromEnvironment(cmd.Flags()); err != nil {
				return UsageError{err}
			}
			// The hive's own inspection commands log through the default.
			slog.SetDefault(logging.NewLogger(stderr))
			return nil
		},
		RunE: func(*cobra.Command, []string) error {
			return Run(h, slog.Default())
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	logging.AddFlags(root.PersistentFlags())
	h.RegisterFlags(root.Flags())

	inspect := h.Command()
	inspect.Args = UsageArgs(cobra.NoArgs)
	root.AddCommand(inspect)
	return root
}

// Execute runs the command line and returns the exit code, having written
// any error to stderr.
func Execute(root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	if errors.As(err, new(UsageError)) {
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", root.Name(), err, root.Name())
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: %s\n", root.Name(), err)
	return ExitFailure
}

// Run runs the hive until SIGTERM, SIGINT or a fatal error. A hive that
// cannot be built from its configuration is a UsageError. A signal caught
// before the hive starts (see package stopsignal: from the process's first
// moments) stops the agent before it touches anything; one caught while it
// starts stops it right after the start, cleanly. SIGHUP is ignored.
func Run(h *hive.Hive, log *slog.Logger) error {
	// What the agent creates (state files, the shell socket, pins) is for
	// root only.
	syscall.Umask(0o077)
	if err := h.Populate(log); err != nil {
		return UsageError{fmt.Errorf("invalid configuration: %w", dig.RootCause(err))}
	}
	signals := stopsignal.Caught()
	select {
	case sig := <-signals:
		log.Info("Signal received before start, not starting", "signal", sig)
		return nil
	default:
	}
	// hive.Run listens for signals only once the hive has started.
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
