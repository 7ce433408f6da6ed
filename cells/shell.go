package cells

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/shell"
	"github.com/spf13/pflag"
)

// DefaultShellSockPath is where the agent's shell listens.
const DefaultShellSockPath = "/run/ipcache-agent/shell.sock"

// The shell's protocol is hive's (cilium/hive/shell): one command a line,
// its output, then endMarker on a line of its own, or the error and
// errorMarker. hive's own client (interactive `shell`) speaks it too.
const (
	endMarker   = "<<end>>"
	errorMarker = "<<error>>"
)

// maxShellLine bounds what a client can make the agent buffer for one
// command line.
const maxShellLine = 64 << 10

// Shell serves the shell on the --shell-sock-path UNIX socket, for
// `ipcache-agent shell`: statedb's db/... commands and the cells' commands,
// but none that writes a table or runs a program (db/insert, db/delete,
// the --delete of the query commands, exec): ownership goes through handles
// only. The socket is for root only: its directory is made mode 0700, the
// socket 0600. Clients connect and leave at debug level.
var Shell = cell.Module(
	"shell",
	"Shell server for ipcache-agent shell",

	cell.Config(shell.Config{ShellSockPath: DefaultShellSockPath}),
	cell.Invoke(registerShellServer),
)

// unservedCommands write tables or run programs.
var unservedCommands = []string{"db/insert", "db/delete", "exec"}

// servedCommands are the hive's commands the agent's shell serves, plus
// help.
func servedCommands(all map[string]script.Cmd) map[string]script.Cmd {
	cmds := map[string]script.Cmd{"help": script.DefaultCmds()["help"]}
	for name, cmd := range all {
		cmds[name] = withoutDelete{cmd}
	}
	for _, name := range unservedCommands {
		delete(cmds, name)
	}
	return cmds
}

// withoutDelete refuses statedb's query commands' --delete (db/get,
// db/prefix, db/list, db/lowerbound), which deletes what the query matched.
type withoutDelete struct{ script.Cmd }

func (c withoutDelete) Usage() *script.CmdUsage {
	usage := *c.Cmd.Usage()
	if register := usage.Flags; register != nil {
		usage.Flags = func(fs *pflag.FlagSet) {
			register(fs)
			if fs.Lookup("delete") != nil {
				fs.MarkHidden("delete")
			}
		}
	}
	return &usage
}

func (c withoutDelete) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	if s.Flags != nil && s.Flags.Changed("delete") {
		return nil, errors.New("--delete is not served: the agent's shell does not write tables")
	}
	return c.Cmd.Run(s, args...)
}

func registerShellServer(cmds hive.ScriptCmds, cfg shell.Config, log *slog.Logger, lc cell.Lifecycle, jobs job.Registry, health cell.Health) {
	if cfg.ShellSockPath == "" {
		log.Info("No --shell-sock-path: not serving the shell")
		return
	}
	s := &shellServer{path: cfg.ShellSockPath, log: log, engine: &script.Engine{Cmds: servedCommands(cmds.Map())}}
	lc.Append(cell.Hook{OnStart: s.listen, OnStop: func(cell.HookContext) error {
		// The listener job closes it; this is for a start that failed
		// before the job ran.
		s.listener.Close()
		return nil
	}})
	jobs.NewGroup(health, job.WithLogger(log)).Add(job.OneShot("listener", s.serve))
}

type shellServer struct {
	path     string
	log      *slog.Logger
	engine   *script.Engine
	listener net.Listener
}

// listen makes the socket, root only, at start: a failure fails the start.
func (s *shellServer) listen(cell.HookContext) error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("shell socket directory: %w", err)
	}
	// An existing directory may have been made with a wider mode.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("shell socket directory: %w", err)
	}
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale shell socket: %w", err)
	}
	l, err := net.Listen("unix", s.path)
	if err != nil {
		return fmt.Errorf("shell socket (--shell-sock-path): %w", err)
	}
	if err := os.Chmod(s.path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("shell socket (--shell-sock-path): %w", err)
	}
	s.listener = l
	return nil
}

// serve accepts clients until the agent stops, then closes their
// connections and waits for them.
func (s *shellServer) serve(ctx context.Context, health cell.Health) error {
	var clients sync.WaitGroup
	defer clients.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		s.listener.Close()
	}()
	health.OK("Listening on " + s.path)
	s.log.Info("Shell listening", "socket", s.path)
	for {
		conn, err := s.listener.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("shell: accept: %w", err)
		}
		clients.Go(func() { s.serveClient(ctx, conn) })
	}
}

func (s *shellServer) serveClient(ctx context.Context, conn net.Conn) {
	s.log.Debug("Shell client connected")
	defer s.log.Debug("Shell client disconnected")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	state, err := script.NewState(ctx, os.TempDir(), nil)
	if err != nil {
		s.log.Error("Shell: new script state", "error", err)
		return
	}
	// A failed write means the client is gone: stop its command.
	out := writerFunc(func(p []byte) (int, error) {
		n, err := conn.Write(p)
		if err != nil {
			cancel()
		}
		return n, err
	})
	lines := bufio.NewScanner(conn)
	lines.Buffer(nil, maxShellLine)
	for lines.Scan() {
		line := lines.Text()
		switch line {
		case "stop", "exit", "quit":
			return
		}
		var written error
		if err := s.execute(state, line, out); err != nil {
			_, written = fmt.Fprintf(out, "%s%s\n", err, errorMarker)
		} else {
			_, written = fmt.Fprintln(out, endMarker)
		}
		if written != nil {
			return // the client went away
		}
	}
}

// execute runs one command line; a command that panics fails, it does not
// take the agent down.
func (s *shellServer) execute(state *script.State, line string, out io.Writer) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("Panic in a shell command", "command", line, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return s.engine.ExecuteLine(state, line, out)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// ShellExchange runs one command on the shell at sockPath and copies its
// output to w. It does not wait for an agent: one that is not listening is
// an error at once.
//
// Possible errors: ErrNoAgent when nothing listens on sockPath; the
// command's own error (its text, as the agent reports it); a connection
// error.
func ShellExchange(sockPath, command string, w io.Writer) error {
	conn, err := DialShell(sockPath)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s\nexit\n", command); err != nil {
		return fmt.Errorf("shell %s: %w", sockPath, err)
	}
	lines := bufio.NewScanner(conn)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if line == "[stdout]" || line == "[stderr]" {
			// Which buffer a command wrote to: for script tests, not people.
			continue
		}
		if before, ok := strings.CutSuffix(line, endMarker); ok {
			if before != "" {
				fmt.Fprintln(w, before)
			}
			return nil
		}
		if before, ok := strings.CutSuffix(line, errorMarker); ok {
			// Of an error of several lines, the others were copied as
			// output: each line is printed once.
			return errors.New(before)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	if err := lines.Err(); err != nil {
		return fmt.Errorf("shell %s: %w", sockPath, err)
	}
	return fmt.Errorf("shell %s: the agent closed the connection", sockPath)
}

// DialShell connects to the shell at sockPath, once: hive's client retries
// for 15 s, which with no agent running only delays the error.
//
// Possible errors: ErrNoAgent when nothing listens on sockPath.
func DialShell(sockPath string) (net.Conn, error) {
	conn, err := net.Dial("unix", sockPath)
	if err != nil {
		return nil, fmt.Errorf("%w on %s (--shell-sock-path): %w", ErrNoAgent, sockPath, err)
	}
	return conn, nil
}
