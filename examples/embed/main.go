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
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/cilium/hive"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/examples/embed/podcell"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a bad flag, argument or configuration: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(args []string, stdout, stderr io.Writer) int {
	// The embedding agent's hive: the project's cells, the shell server
	// (`ipcache-agent shell --shell-sock-path ...` talks to it) and its own.
	h := cells.NewHive(cells.ControlPlane, cells.Shell, podcell.Cell)
	root := newRootCommand(h, stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "embed: %s\n", err)
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

func newRootCommand(h *hive.Hive, stdout, stderr io.Writer) *cobra.Command {
	logging := cells.DefaultLogging
	root := &cobra.Command{
		Use:   "embed",
		Short: "Example agent embedding ipcache-agent, publishing pods with explicit identities",
		Long: `embed runs ipcache-agent's cells and a cell of its own that publishes the pods
of --pods-file ("address identity" lines) into the ipcache with their
explicitly allocated identities, until SIGTERM or SIGINT.
Exit codes: 0 clean stop, 1 runtime failure, 2 bad flags or configuration.`,
		Args:          cobra.NoArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRun: func(*cobra.Command, []string) {
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
	root.AddCommand(h.Command())
	return root
}

// runAgent runs the hive until SIGTERM, SIGINT or a fatal error.
func runAgent(h *hive.Hive, log *slog.Logger) error {
	syscall.Umask(0o077)
	if err := h.Populate(log); err != nil {
		return usageError{fmt.Errorf("invalid configuration: %w", err)}
	}
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
