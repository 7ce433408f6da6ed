// SPDX-License-Identifier: Apache-2.0

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
	"regexp"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/shell"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/monitorcell"
)

// DefaultShellSockPath is where the agent's shell listens.
const DefaultShellSockPath = "/run/ipcache-agent/shell.sock"

// The shell's protocol is hive's (cilium/hive/shell): one command a line,
// its output, then endMarker on a line of its own, or the error and
// errorMarker. hive's own client (interactive `shell`) speaks it too.
const (
	endMarker   = "<<end>>"
	errorMarker = "<<error>>"
	// What the engine writes before a command's stdout and stderr, and
	// the server before an error.
	stdoutMarker = "[stdout]"
	stderrMarker = "[stderr]"
)

// maxShellLine bounds what a client can make the agent buffer for one
// command line.
const maxShellLine = 64 << 10

// Shell serves the shell on the --shell-sock-path UNIX socket, for
// `ipcache-agent shell`: statedb's db/... commands and the cells' commands,
// but none that writes a table, a file or runs a program (db/insert,
// db/delete, the --delete of the query commands, the --out of db/show,
// db/dump and the query commands, exec): ownership goes through handles
// only. The socket is for root only: its directory is made mode 0700, the
// socket 0600. Clients connect and leave at debug level.
//
// Process-wide state: while commands run, the shell lowers the Go
// runtime's soft memory limit (debug.SetMemoryLimit) to bound their
// garbage, and sets it back when the last one ends; a lower limit set by
// the embedder or GOMEMLIMIT is kept.
var Shell = cell.Module(
	"shell",
	"Shell server for ipcache-agent shell",

	cell.Config(shell.Config{ShellSockPath: DefaultShellSockPath}),
	cell.Invoke(registerShellServer),
)

// unservedCommands write tables or run programs.
var unservedCommands = []string{"db/insert", "db/delete", "exec"}

// servedCommands are the hive's commands the agent's shell serves, plus
// help, each writing its output to the client as it goes (see
// shellstream.go).
func servedCommands(db *statedb.DB, all map[string]script.Cmd) map[string]script.Cmd {
	cmds := servedSet(all)
	for name, cmd := range cmds {
		if name != "help" {
			cmds[name] = streamedStdout{cmd}
		}
	}
	newStreamedQueries(db, cmds)
	for name, cmd := range cmds {
		cmds[name] = withoutWrites{cmd}
	}
	return cmds
}

// servedSet is help and the commands of all the shell serves, as they are.
func servedSet(all map[string]script.Cmd) map[string]script.Cmd {
	cmds := map[string]script.Cmd{"help": script.DefaultCmds()["help"]}
	for name, cmd := range all {
		if !slices.Contains(unservedCommands, name) {
			cmds[name] = cmd
		}
	}
	return cmds
}

// hiveCommands are the commands hive.Hive.ScriptCommands adds of its own
// (to start and stop the hive in script tests); the shell serves the
// cells' commands only.
var hiveCommands = []string{"hive", "hive/start", "hive/stop"}

// ShellCommandSummaries returns the name and one-line summary of each
// command the agent's shell serves, from the hive's cells, without
// starting the hive: for `ipcache-agent shell --help`, which lists them
// as the agent built from h would serve them. It populates h (the cells'
// constructors and Invokes run, which touch neither the kernel nor the
// disk, as for `hive`), so h is not to be run afterwards.
//
// Possible errors: the hive cannot be populated from its configuration.
func ShellCommandSummaries(h *hive.Hive, log *slog.Logger) (map[string]string, error) {
	all, err := h.ScriptCommands(log)
	if err != nil {
		return nil, err
	}
	for _, name := range hiveCommands {
		delete(all, name)
	}
	summaries := map[string]string{}
	for name, cmd := range servedSet(all) {
		summaries[name] = cmd.Usage().Summary
	}
	return summaries, nil
}

// unservedFlags write: statedb's query commands' --delete (db/get,
// db/prefix, db/list, db/lowerbound) deletes what the query matched, and
// the --out of db/show, db/dump and the query commands writes a file, as
// root, wherever the client names.
var unservedFlags = map[string]string{
	"delete": "--delete is not served: the agent's shell does not write tables",
	"out":    "--out (-o) is not served: the agent's shell writes no files; redirect the output of `ipcache-agent shell` instead",
}

// withoutWrites refuses unservedFlags, and hides them from the usage.
type withoutWrites struct{ script.Cmd }

func (c withoutWrites) Usage() *script.CmdUsage {
	usage := *c.Cmd.Usage()
	usage.Detail = detailParagraphs(usage.Detail)
	if register := usage.Flags; register != nil {
		usage.Flags = func(fs *pflag.FlagSet) {
			register(fs)
			for name := range unservedFlags {
				if fs.Lookup(name) != nil {
					fs.MarkHidden(name)
				}
			}
		}
	}
	return &usage
}

// helpWidth is where hive's help wraps each line of a command's Detail.
const helpWidth = 60

// detailParagraphs joins the lines of a command's Detail that their author
// wrapped wider than helpWidth into paragraphs. hive's help wraps each
// element of Detail on its own at helpWidth, so a sentence the author
// broke at 72 columns came out broken twice ("status: done (in" / "the
// ipcache map)"). A line that fits is left where its author ended it
// (lists, examples), and one starting with a space, '-' or '>' starts a
// paragraph of its own.
func detailParagraphs(detail []string) []string {
	var out []string
	joining := false
	for _, line := range detail {
		starts := line == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "-") || strings.HasPrefix(line, ">")
		if joining && !starts {
			out[len(out)-1] += " " + line
		} else {
			out = append(out, line)
		}
		joining = len(line) > helpWidth
	}
	return out
}

func (c withoutWrites) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	if s.Flags != nil {
		for name, refusal := range unservedFlags {
			if s.Flags.Lookup(name) != nil && s.Flags.Changed(name) {
				return nil, errors.New(refusal)
			}
		}
	}
	return c.Cmd.Run(s, args...)
}

func registerShellServer(db *statedb.DB, cmds hive.ScriptCmds, scopes *healthScopes, cfg shell.Config, log *slog.Logger, lc cell.Lifecycle, jobs job.Registry, health cell.Health) {
	if cfg.ShellSockPath == "" {
		log.Info("No --shell-sock-path: not serving the shell")
		return
	}
	all := cmds.Map()
	// The shell's `health <pattern>` waits a bounded time by default: a
	// script polling the agent wants an answer (script tests keep theirs
	// unbounded, up to the test's own deadline).
	all["health"] = scopes.command(shellHealthTimeout)
	s := &shellServer{
		path:     cfg.ShellSockPath,
		log:      log,
		engine:   &script.Engine{Cmds: servedCommands(db, all)},
		clients:  make(chan struct{}, maxShellClients),
		commands: make(chan struct{}, maxShellCommands),
		watches:  make(chan struct{}, maxShellWatches),

		commandWait: shellCommandWait,
	}
	lc.Append(cell.Hook{OnStart: s.listen, OnStop: func(cell.HookContext) error {
		// The listener job closes it; this is for a start that failed
		// before the job ran.
		s.listener.Close()
		return nil
	}})
	jobs.NewGroup(health, job.WithLogger(log)).Add(job.OneShot("listener", s.serve))
}

// What the shell costs is bounded: memory and CPU by how many commands
// run at once (most stream their output, see shellstream.go, but the
// cells' commands build theirs in memory), goroutines, sockets and line
// buffers by how many clients are served. A command waits for its turn
// while its client is connected, up to shellCommandWait; a client beyond
// maxShellClients is told the shell is busy and let go.
const (
	maxShellClients  = 64
	maxShellCommands = 2
	shellCommandWait = time.Minute
	// db/watch runs until its client leaves, so it takes no turn; it has
	// its own limit instead, as its first listing (statedb's) is the whole
	// table, in memory.
	maxShellWatches = 2
	// A client that reads nothing for this long is let go: its command
	// would hold its turn, and its read transaction the table's old
	// objects.
	shellWriteTimeout = 10 * time.Second
	// How often a running command's client is checked for having left.
	shellHangupCheck = 200 * time.Millisecond
	// Commands that wrote this much since the last time make the shell
	// return their memory to the system once none runs (returnMemory): a
	// few `db/show ipcache` at 200k prefixes, not a `health` loop.
	returnMemoryAfter = 16 << 20
	// What the runtime may use over what it used when the shell's
	// commands started, while they run (limitMemory): the documented bound
	// is 200 MB over the steady state.
	shellMemoryHeadroom = 150 << 20
)

// watchCommands run until their client leaves: statedb's db/watch and
// the monitor's (monitorcell.Command). They share the
// limit of maxShellWatches.
var watchCommands = map[string]bool{"db/watch": true, monitorcell.Command: true}

// waitingCommands mostly wait (health for a row that matches its pattern,
// db/initialized for tables), holding little: they take no turn, which
// they could hold as long as they wait.
var waitingCommands = map[string]bool{"health": true, "db/initialized": true}

type shellServer struct {
	path     string
	log      *slog.Logger
	engine   *script.Engine
	listener net.Listener

	// Tokens, one per client served, command running and db/watch.
	clients, commands, watches chan struct{}
	// What the commands wrote since the memory was last returned, and
	// whether it is being returned (see returnMemory).
	written   atomic.Int64
	returning atomic.Bool
	// Commands running, and the memory limit before the first (see
	// limitMemory).
	limitMu     sync.Mutex
	running     int
	limitBefore int64
	// How long a command waits for its turn: shellCommandWait.
	commandWait time.Duration
}

// listen makes the socket, root only, at start: a failure fails the start.
func (s *shellServer) listen(cell.HookContext) error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create shell socket directory: %w", err)
	}
	// An existing directory may have been made with a wider mode.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("make shell socket directory private (mode 0700): %w", err)
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
			return fmt.Errorf("accept shell connection: %w", err)
		}
		select {
		case s.clients <- struct{}{}:
			clients.Go(func() {
				defer func() { <-s.clients }()
				s.serveClient(ctx, conn)
			})
		default:
			s.log.Debug("Shell busy: client refused", "clients", maxShellClients)
			clients.Go(func() { s.refuse(conn) })
		}
	}
}

// refuse tells a client beyond maxShellClients that the shell is busy,
// as the error of its first command.
func (s *shellServer) refuse(conn net.Conn) {
	defer conn.Close()
	// Read its command first: a client whose command found the socket
	// closed would see a broken pipe, not why.
	conn.SetDeadline(time.Now().Add(time.Second))
	bufio.NewReaderSize(conn, 4096).ReadSlice('\n')
	fmt.Fprintf(conn, "%v: %d clients connected, the most it serves at once; try again later%s\n",
		ErrShellBusy, maxShellClients, errorMarker)
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
	// A failed write means the client is gone, or reads nothing: stop its
	// command.
	out := writerFunc(func(p []byte) (int, error) {
		conn.SetWriteDeadline(time.Now().Add(shellWriteTimeout))
		n, err := conn.Write(p)
		s.written.Add(int64(n))
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
		if err := s.executeWhileConnected(ctx, cancel, conn, line, out); err != nil {
			// Marked as stderr, so that a client tells the error's lines
			// (a usage has several) from the output before it; hive's
			// client skips the marker.
			_, written = fmt.Fprintf(out, "%s\n%s%s\n", stderrMarker, s.errorText(err), errorMarker)
		} else {
			_, written = fmt.Fprintln(out, endMarker)
		}
		s.returnMemory()
		if written != nil {
			return // the client went away
		}
	}
}

// errorText is a command's error as the client shows it: without the
// engine's "<stdin>:0: " (there is no script file), and followed by the
// command's usage when the error is one of usage (wrong arguments, an
// unknown flag).
func (s *shellServer) errorText(err error) string {
	text := err.Error()
	var cmdErr *script.CommandError
	if !errors.As(err, &cmdErr) {
		return text
	}
	text = strings.TrimPrefix(text, fmt.Sprintf("%s:%d: ", cmdErr.File, cmdErr.Line))
	if isUsageError(cmdErr.Err) {
		var usage strings.Builder
		if s.engine.ListCmds(&usage, true, "^"+regexp.QuoteMeta(cmdErr.Op)+"$") == nil && usage.Len() > 0 {
			var lines []string
			for line := range strings.Lines(usage.String()) {
				if line = strings.TrimRight(line, " \t\n"); line != "" {
					lines = append(lines, line)
				}
			}
			text += "\nusage: " + strings.Join(lines, "\n")
		}
	}
	return text
}

// isUsageError reports whether a command's error is one of usage: the
// script engine's ErrUsage, or a flag the command does not take (pflag's
// errors, which have no sentinel).
func isUsageError(err error) bool {
	if errors.Is(err, script.ErrUsage) {
		return true
	}
	for _, prefix := range []string{"unknown flag", "unknown shorthand flag", "flag needs an argument", "invalid argument", "bad flag syntax"} {
		if strings.HasPrefix(err.Error(), prefix) {
			return true
		}
	}
	return false
}

// limitMemory bounds the memory the runtime may use while commands run to
// what it needed when the first of them started plus shellMemoryHeadroom
// (the Go runtime's soft limit, debug.SetMemoryLimit: the collector runs
// more often as it nears it), and sets the limit back once the last one
// ended. Without it, the collector lets the heap grow to twice the live
// heap, and the live heap of the control plane at 200k prefixes is
// hundreds of MB (docs/SCALE.md): the garbage of the commands' output
// alone would take the agent
// that far over its steady state. A lower limit set by the embedder (or
// GOMEMLIMIT) stays.
func (s *shellServer) limitMemory(delta int) {
	s.limitMu.Lock()
	defer s.limitMu.Unlock()
	s.running += delta
	switch {
	case delta > 0 && s.running == 1:
		samples := []metrics.Sample{{Name: "/memory/classes/total:bytes"},
			{Name: "/memory/classes/heap/released:bytes"}, {Name: "/memory/classes/heap/free:bytes"},
			{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
		metrics.Read(samples)
		value := func(i int) int64 { return int64(samples[i].Value.Uint64()) }
		// The base is what the runtime needs: what it holds from the
		// system less its free spans and the garbage not yet collected,
		// that is the live heap at the last collection and the runtime's
		// own memory. Neither the heap goal (up to twice the live heap)
		// nor what it holds (the garbage of commands that just ended,
		// when the shell was idle only for a moment between two) would
		// do as the base: the limit would ratchet up from one burst of
		// commands to the next, past the documented bound over the
		// steady state.
		held := value(0) - value(1) // what the runtime's limit counts
		needed := held - value(2) - value(3) + value(4)
		// The floor is what it holds and only a quarter of the headroom:
		// a limit under it would have the collector run and the scavenger
		// return memory at once, at every command that takes a turn (a
		// monitoring script's `health` too), and a live heap that grew
		// since the last collection would have the collector run all the
		// time.
		s.limitBefore = debug.SetMemoryLimit(-1)
		debug.SetMemoryLimit(min(s.limitBefore, max(needed+shellMemoryHeadroom, held+shellMemoryHeadroom/4)))
	case delta < 0 && s.running == 0:
		debug.SetMemoryLimit(s.limitBefore)
	}
}

// returnMemory gives the memory of the shell's commands back to the
// system once the last running command is done, if they wrote at least
// returnMemoryAfter since the last time: the runtime returns free memory
// to the system only slowly (its scavenger), and the output of large
// commands leaves tens of megabytes of garbage each, on top of the
// control plane's steady heap. One forced collection (debug.FreeOSMemory)
// at a time, off the client's path.
func (s *shellServer) returnMemory() {
	if len(s.commands) > 0 || s.written.Load() < returnMemoryAfter || !s.returning.CompareAndSwap(false, true) {
		return
	}
	s.written.Store(0)
	go func() {
		defer s.returning.Store(false)
		debug.FreeOSMemory()
	}()
}

// executeWhileConnected runs one command line, and calls hangup if the
// client closes its connection meanwhile: a command that waits (health
// with a pattern, db/watch) would otherwise notice only when it next
// writes, and hold its client's place until then.
func (s *shellServer) executeWhileConnected(ctx context.Context, hangup func(), conn net.Conn, line string, out io.Writer) error {
	done := make(chan struct{})
	defer close(done)
	if raw, err := conn.(syscall.Conn).SyscallConn(); err == nil {
		go func() {
			ticker := time.NewTicker(shellHangupCheck)
			defer ticker.Stop()
			for {
				select {
				case <-done:
					return
				case <-ticker.C:
				}
				if hungUp(raw) {
					hangup()
					return
				}
			}
		}()
	}
	return s.execute(ctx, line, out)
}

// hungUp reports whether the peer closed the connection (POLLHUP: a client
// that only shut its writing side down still reads the output).
func hungUp(raw syscall.RawConn) bool {
	var hup bool
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd)}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hup = fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return hup
}

// execute runs one command line in its turn, in a State of its own: what
// a command made the State hold (the engine's log buffer keeps the size of
// the largest output written through it) goes with it. A command that
// panics fails, it does not take the agent down.
func (s *shellServer) execute(ctx context.Context, line string, out io.Writer) (err error) {
	release, err := s.turn(ctx, line)
	if err != nil {
		return err
	}
	defer release()
	state, err := script.NewState(ctx, os.TempDir(), nil)
	if err != nil {
		return fmt.Errorf("new script state: %w", err)
	}
	defer state.CloseAndWait(io.Discard)
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("Panic in a shell command", "command", line, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return s.engine.ExecuteLine(state, line, out)
}

// turn waits for the command's turn to run; the caller calls release when
// it is done.
//
// Possible errors: ErrShellBusy when no turn came within commandWait,
// or when maxShellWatches db/watch run already; ctx's.
func (s *shellServer) turn(ctx context.Context, line string) (release func(), err error) {
	name := commandName(line)
	if watchCommands[name] {
		select {
		case s.watches <- struct{}{}:
			return func() { <-s.watches }, nil
		default:
			return nil, fmt.Errorf("%w: %d db/watch or monitor already running, the most it serves at once; try again later",
				ErrShellBusy, maxShellWatches)
		}
	}
	if waitingCommands[name] {
		return func() {}, nil
	}
	wait := time.NewTimer(s.commandWait)
	defer wait.Stop()
	select {
	case s.commands <- struct{}{}:
		s.limitMemory(+1)
		return func() {
			s.limitMemory(-1)
			<-s.commands
		}, nil
	case <-wait.C:
		return nil, fmt.Errorf("%w: %d commands running for over %s; try again later",
			ErrShellBusy, cap(s.commands), s.commandWait)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// commandName is the name of a line's command, past the script engine's
// prefixes ("! ", "? ", "[condition] "), so that none of them takes a
// command out of its limit.
func commandName(line string) string {
	for _, field := range strings.Fields(line) {
		if field == "!" || field == "?" || strings.HasPrefix(field, "[") {
			continue
		}
		return field
	}
	return ""
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// ShellExchange runs one command on the shell at sockPath and copies its
// output to w. It does not wait for an agent: one that is not listening is
// an error at once. A failed command's error is returned, not copied to
// w: what the command wrote to its stderr comes first in it, unless the
// error already says it.
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
		return fmt.Errorf("send command to shell %s: %w", sockPath, err)
	}
	out := newReplyOutput(conn, w)
	failure, err := readReply(out.lines, out, sockPath)
	if err := out.Flush(); err != nil {
		return err
	}
	if err != nil {
		return err
	}
	return failure
}

// replyOutput is the connection's lines, and the output they are copied
// to, held until the connection is read again: a write a line was a
// system call a line, most of what the client spent on a table of 200k
// rows (docs/SCALE.md). What it holds is written before each read of the
// connection, so the lines of a command that streams (monitor, db/watch)
// are written as soon as they are all the client has.
type replyOutput struct {
	*bufio.Writer
	conn  io.Reader
	lines *bufio.Scanner
}

// replyReadSize is what one read of the connection may take, and so the
// most the output holds from it.
const replyReadSize = 64 << 10

func newReplyOutput(conn io.Reader, w io.Writer) *replyOutput {
	o := &replyOutput{Writer: bufio.NewWriterSize(w, replyReadSize), conn: conn}
	o.lines = bufio.NewScanner(connReader{o})
	o.lines.Buffer(make([]byte, replyReadSize), 1<<20)
	return o
}

// connReader reads the connection for the scanner, after writing what the
// output holds.
type connReader struct{ o *replyOutput }

func (r connReader) Read(p []byte) (int, error) {
	if err := r.o.Flush(); err != nil {
		return 0, outputError{err}
	}
	return r.o.conn.Read(p)
}

// outputError is a failed write of the output, which the scanner reports
// as its read's.
type outputError struct{ err error }

func (e outputError) Error() string { return e.err.Error() }
func (e outputError) Unwrap() error { return e.err }

// readReply copies the reply to one command to w, up to its end marker,
// and returns the command's error as failure. The lines after a stderr
// marker are held until the reply goes on: output if more follows or the
// command succeeded, part of the error if it failed.
//
// Possible errors: writing to w; reading the connection.
func readReply(lines *bufio.Scanner, w io.Writer, sockPath string) (failure, err error) {
	var stderr, previous []string
	inStderr := false
	flush := func() error {
		for _, line := range append(previous, stderr...) {
			if _, err := fmt.Fprintln(w, line); err != nil {
				return err
			}
		}
		previous, stderr, inStderr = nil, nil, false
		return nil
	}
	for lines.Scan() {
		line := lines.Text()
		switch line {
		case stdoutMarker:
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		case stderrMarker:
			previous, stderr, inStderr = append(previous, stderr...), nil, true
			continue
		}
		if before, ok := strings.CutSuffix(line, endMarker); ok {
			if before != "" {
				stderr = append(stderr, before)
			}
			if !inStderr {
				previous, stderr = append(previous, stderr...), nil
			}
			return nil, flush()
		}
		if before, ok := strings.CutSuffix(line, errorMarker); ok {
			text := strings.Join(append(stderr, before), "\n")
			if !inStderr {
				// An agent that does not mark its errors: the last line.
				if err := flush(); err != nil {
					return nil, err
				}
				text = before
			}
			// What the command wrote to stderr is, most often, its
			// error again (scriptcmd.Result).
			if said := strings.TrimSpace(strings.Join(previous, "\n")); said != "" && !strings.Contains(text, said) {
				text = said + "\n" + text
			}
			return errors.New(text), nil
		}
		if inStderr {
			stderr = append(stderr, line)
			continue
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return nil, err
		}
	}
	if err := lines.Err(); err != nil {
		if output := (outputError{}); errors.As(err, &output) {
			return nil, output.err
		}
		return nil, fmt.Errorf("read reply of shell %s: %w", sockPath, err)
	}
	return nil, fmt.Errorf("read reply of shell %s: the agent closed the connection", sockPath)
}

// ShellScript runs the commands of r, one a line (blank lines and lines
// starting with # skipped, "exit" ends), on one connection to the shell at
// sockPath: what `ipcache-agent shell` does with commands piped into it.
// Each command's output goes to stdout, its error to stderr; a failed
// command does not stop the others.
//
// Possible errors: ErrNoAgent when nothing listens on sockPath;
// ErrShellCommandsFailed when a command failed; a connection error, or
// reading r.
func ShellScript(sockPath string, r io.Reader, stdout, stderr io.Writer) error {
	conn, err := DialShell(sockPath)
	if err != nil {
		return err
	}
	defer conn.Close()
	out := newReplyOutput(conn, stdout)
	commands := bufio.NewScanner(r)
	commands.Buffer(nil, maxShellLine)
	ran, failed := 0, 0
	for commands.Scan() {
		line := strings.TrimSpace(commands.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if line == "exit" || line == "quit" || line == "stop" {
			break
		}
		if _, err := fmt.Fprintln(conn, line); err != nil {
			return fmt.Errorf("send command to shell %s: %w", sockPath, err)
		}
		ran++
		failure, err := readReply(out.lines, out, sockPath)
		// The command's output before its error, and before the next
		// command is read (a terminal's user waits for it).
		if err := out.Flush(); err != nil {
			return err
		}
		if err != nil {
			return err
		}
		if failure != nil {
			failed++
			fmt.Fprintln(stderr, failure)
		}
	}
	if err := commands.Err(); err != nil {
		return fmt.Errorf("read commands: %w", err)
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d", ErrShellCommandsFailed, failed, ran)
	}
	return nil
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
