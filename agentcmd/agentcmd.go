// SPDX-License-Identifier: Apache-2.0

// Package agentcmd is the command line of an agent built from the
// project's cells: ipcache-agent's own, and that of a larger agent that
// embeds the cells (examples/embed). It runs the hive until SIGTERM or
// SIGINT, inspects it (`hive`, `hive dot-graph`), sets up logging
// (--log-level, --log-format), sets flags from the environment and maps
// errors to exit codes.
//
// # Process-wide state
//
// A command line is a process's, so agentcmd changes what belongs to the
// process, in these places only:
//
//   - Importing agentcmd imports package stopsignal, whose init catches
//     SIGTERM and SIGINT, keeps SIGPIPE from killing the process and
//     ignores SIGHUP, from the process's first moments (see stopsignal for
//     why it cannot wait). A command of the root built by [NewRootCommand]
//     other than the agent itself gives SIGTERM, SIGINT and SIGPIPE their
//     default behaviour back before it runs (stopsignal.Release). While
//     the agent runs, hive's Run also listens for SIGINT and SIGTERM.
//   - Running the agent (the root command without a subcommand) sets the
//     process's umask to 077 before it builds the hive, so that what the
//     agent creates (state files, the shell socket, pins) is for root only
//     whatever umask it was started with. It is not restored: the agent
//     runs until the process ends.
//   - [NewRootCommand] reads the environment (IPCACHE_AGENT_<FLAG>) and sets
//     flags from it.
//
// agentcmd does not replace slog's default logger: the agent and the
// hive's inspection commands log through the logger made from
// --log-level and --log-format, passed to them.
package agentcmd

import (
	"context"
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

// Exit codes, as [Execute] returns them.
const (
	ExitOK      = 0 // clean stop
	ExitFailure = 1 // runtime failure
	ExitUsage   = 2 // bad flags, arguments or configuration
)

// UsageArgs makes an argument validation error a [UsageError]: a command
// given wrong arguments exits 2.
func UsageArgs(validate cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := validate(cmd, args); err != nil {
			return UsageError{err}
		}
		return nil
	}
}

// NewRootCommand returns the root command of an agent: without a
// subcommand it runs the hive until SIGTERM, SIGINT or a fatal error;
// `hive` and `hive dot-graph` inspect it. The hive's flags and the logging
// flags are registered; flag errors are UsageErrors. Every flag of the
// command that runs, its subcommands' included, can also be set in the
// environment (IPCACHE_AGENT_<FLAG>, see envName); the command line wins.
// use, short and long are the command's usage texts. Logs go to stderr,
// `hive`'s listing to stdout; `hive dot-graph` writes its graph to the
// process's standard output, as hive does.
//
// Running the agent sets the process's umask to 077, and subcommands other
// than the agent give the signals stopsignal catches their default
// behaviour back: see the package documentation.
//
// The command's errors: a [UsageError] for bad flags, arguments, variables
// or configuration (a hive that cannot be built from it); any other error
// is the agent failing at run time, wrapped as "agent failed: %w".
func NewRootCommand(h *hive.Hive, use, short, long string, stdout, stderr io.Writer) *cobra.Command {
	logging := cells.DefaultLogging
	// Made from the logging flags once they are parsed.
	var log *slog.Logger
	// The flags set from the environment, named in configuration errors.
	var fromEnv envFlags
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
			var err error
			if fromEnv, err = setFromEnvironment(cmd.Flags()); err != nil {
				return UsageError{err}
			}
			log = logging.NewLogger(stderr)
			return nil
		},
		RunE: func(*cobra.Command, []string) error {
			return runAgent(h, log, fromEnv)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	logging.AddFlags(root.PersistentFlags())
	h.RegisterFlags(root.Flags())

	root.AddCommand(newInspectCommand(h, &log, &fromEnv, stdout))
	return root
}

// newInspectCommand is hive's `hive` and `hive dot-graph`, logging through
// *log rather than slog's default logger, which hive's own use. A hive that
// cannot be built from its configuration is a UsageError, as for the agent.
func newInspectCommand(h *hive.Hive, log **slog.Logger, fromEnv *envFlags, stdout io.Writer) *cobra.Command {
	inspect := h.Command()
	inspect.Args = UsageArgs(cobra.NoArgs)
	inspect.RunE = func(*cobra.Command, []string) error {
		if err := populate(h, *log, *fromEnv); err != nil {
			return err
		}
		return h.PrintObjects(stdout, *log)
	}
	for _, sub := range inspect.Commands() {
		run := sub.RunE
		sub.Args = UsageArgs(cobra.NoArgs)
		sub.RunE = func(cmd *cobra.Command, args []string) error {
			// A hive is populated once: hive's own populating with slog's
			// default logger, next, does nothing.
			if err := populate(h, *log, *fromEnv); err != nil {
				return err
			}
			return run(cmd, args)
		}
	}
	return inspect
}

// populate builds the hive's objects from its configuration. An error
// that names a flag set from the environment names its variable too
// (fromEnv.name).
//
// Possible errors: a UsageError when the hive cannot be built from its
// configuration.
func populate(h *hive.Hive, log *slog.Logger, fromEnv envFlags) error {
	// The error is returned and printed once, as every command's: hive's
	// own log line about it would say it a second time.
	log = slog.New(withoutInvokeFailed{log.Handler()})
	if err := h.Populate(log); err != nil {
		return UsageError{fmt.Errorf("invalid configuration: %w", fromEnv.name(dig.RootCause(err)))}
	}
	return nil
}

// withoutInvokeFailed drops hive's "Invoke failed" record, the log line
// hive writes for the error Populate returns.
type withoutInvokeFailed struct{ slog.Handler }

func (h withoutInvokeFailed) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelError && r.Message == "Invoke failed" {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h withoutInvokeFailed) WithAttrs(attrs []slog.Attr) slog.Handler {
	return withoutInvokeFailed{h.Handler.WithAttrs(attrs)}
}

func (h withoutInvokeFailed) WithGroup(name string) slog.Handler {
	return withoutInvokeFailed{h.Handler.WithGroup(name)}
}

// Execute runs the command line and returns the exit code, having written
// any error to stderr: [ExitUsage] for a [UsageError] (followed by a hint
// at the --help of the command that was given it, its full path, e.g.
// 'agent policy validate --help'), [ExitFailure] for any other error,
// [ExitOK] without one.
func Execute(root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	// cobra returns the command it found even when its flags do not parse:
	// that command's help is the one that tells what it takes.
	cmd, err := root.ExecuteC()
	if err == nil {
		return ExitOK
	}
	if errors.As(err, new(UsageError)) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", root.Name(), err, cmd.CommandPath())
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: %s\n", root.Name(), err)
	return ExitFailure
}

// runAgent runs the hive until SIGTERM, SIGINT or a fatal error. A signal
// caught before the hive starts (see package stopsignal: from the process's
// first moments) stops the agent before it touches anything; one caught
// while it starts stops it right after the start, cleanly. SIGHUP is
// ignored.
//
// Possible errors: a UsageError when the hive cannot be built from its
// configuration; "agent failed: %w" with the hive's error when it fails to
// start or to stop, or a cell stops it with an error.
func runAgent(h *hive.Hive, log *slog.Logger, fromEnv envFlags) error {
	// What the agent creates (state files, the shell socket, pins) is for
	// root only, whatever umask it was started with (see the package
	// documentation).
	syscall.Umask(0o077)
	if err := populate(h, log, fromEnv); err != nil {
		return err
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
