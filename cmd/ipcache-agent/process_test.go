// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// agentDirs are the private directories of an agent process under test:
// its state directory (which also holds the shell socket) and bpffs root.
type agentDirs struct {
	stateDir, bpfRoot string
}

func newAgentDirs(t *testing.T) agentDirs {
	t.Helper()
	d := agentDirs{stateDir: filepath.Join(t.TempDir(), "state"), bpfRoot: filepath.Join(t.TempDir(), "bpf")}
	// The agent mounts bpffs there; it outlives the agent.
	t.Cleanup(func() { unix.Unmount(d.bpfRoot, unix.MNT_DETACH) })
	return d
}

func (d agentDirs) sockPath() string { return filepath.Join(d.stateDir, "shell.sock") }

// args are the agent's flags for these directories, then extra.
func (d agentDirs) args(extra ...string) []string {
	return append([]string{"--state-dir=" + d.stateDir, "--bpf-root=" + d.bpfRoot,
		"--shell-sock-path=" + d.sockPath()}, extra...)
}

// agentProcess is a running agent whose exit is watched.
type agentProcess struct {
	cmd    *exec.Cmd
	log    *syncbuf.Buffer
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// startAgentProcess starts cmd (its output goes to the returned log unless
// the caller set Stdout and Stderr) and watches for its exit; the agent is
// killed at the end of the test if it still runs.
func startAgentProcess(t *testing.T, cmd *exec.Cmd) *agentProcess {
	t.Helper()
	p := &agentProcess{cmd: cmd, log: &syncbuf.Buffer{}, exited: make(chan struct{})}
	if cmd.Stdout == nil && cmd.Stderr == nil {
		cmd.Stdout, cmd.Stderr = p.log, p.log
	}
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// waitStarted waits for the agent to log that the hive started.
func (p *agentProcess) waitStarted(t *testing.T) {
	t.Helper()
	waitAgentStarted(t, p.log, p.cmd.Process.Pid)
}

// agentStartTimeout bounds the wait for an agent's "Started hive". Idle,
// an agent built with -race starts in under a second; in CI, beside the
// other packages' tests and lint on two cores, one once took more than
// 15 s to load its program.
const agentStartTimeout = 60 * time.Second

// waitAgentStarted waits until log, the output of the agent process pid,
// says the hive started, and fails the test with the log if the process
// exits first (an agent that refuses its flags or configuration exits at
// once). An agent that does neither in time is sent SIGQUIT, so that the
// log the test fails with holds every goroutine's stack: a hung start
// says where it hangs.
func waitAgentStarted(t *testing.T, log fmt.Stringer, pid int) {
	t.Helper()
	deadline := time.Now().Add(agentStartTimeout)
	for !strings.Contains(log.String(), "Started hive") {
		if exited(pid) {
			t.Fatalf("agent exited at start: %s", log)
		}
		if time.Now().After(deadline) {
			_ = unix.Kill(pid, unix.SIGQUIT)
			for end := time.Now().Add(5 * time.Second); !exited(pid) && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("agent did not start in %s (sent SIGQUIT for its stacks): %s", agentStartTimeout, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *agentProcess) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and requires a clean exit.
func (p *agentProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.requireExit(t, agentcmd.ExitOK)
}

// requireExit waits for the agent to exit with code.
func (p *agentProcess) requireExit(t *testing.T, code int) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not exit: %s", p.log)
	}
	require.Equal(t, code, p.cmd.ProcessState.ExitCode(), "%s; log:\n%s", p.cmd.ProcessState, p.log)
}

// signalsCaught reports whether the process has set up its signals
// (package stopsignal): SIGHUP shows as ignored once SIGTERM and SIGINT are
// caught. It is false while the process is still the Go runtime
// starting, before any package is initialized, where no program's code can
// catch a signal.
func signalsCaught(pid int) (bool, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false, err
	}
	_, rest, _ := strings.Cut(string(status), "\nSigIgn:\t")
	ignored, err := strconv.ParseUint(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 16, 64)
	if err != nil {
		return false, err
	}
	return ignored&(1<<(syscall.SIGHUP-1)) != 0, nil
}

// TestPrivilegedEarlySIGTERMExitsZero sends SIGTERM 0-20 ms after exec,
// 30 times: during the package initialization, flag parsing, the hive's
// construction or start, or once it runs. Every time the agent exits 0,
// never killed by the signal. A signal due while the process is still the
// Go runtime starting (the first milliseconds on a loaded machine, before
// any package's init; it kills any Go program) is sent as soon as that is
// over, and counted.
func TestPrivilegedEarlySIGTERMExitsZero(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	deferred := 0
	for i := range 30 {
		delay := time.Duration(rand.Int64N(int64(20 * time.Millisecond)))
		cmd := agentCommand(newAgentDirs(t).args()...)
		// Without the race detector's second at exit.
		cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0")
		p := startAgentProcess(t, cmd)
		time.Sleep(delay)
		for deadline := time.Now().Add(5 * time.Second); ; {
			caught, err := signalsCaught(p.cmd.Process.Pid)
			if caught || err != nil || p.hasExited() {
				break
			}
			require.True(t, time.Now().Before(deadline), "run %d: the agent does not catch signals", i)
			deferred++
			time.Sleep(100 * time.Microsecond)
		}
		sent := time.Now()
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		<-p.exited
		require.Equal(t, agentcmd.ExitOK, p.cmd.ProcessState.ExitCode(),
			"run %d, SIGTERM %s after exec: %s\n%s", i, delay, p.cmd.ProcessState, p.log)
		t.Logf("run %d: SIGTERM %s after exec, exit 0 %s later", i, delay.Round(time.Microsecond), time.Since(sent).Round(time.Millisecond))
	}
	t.Logf("%d polls of 100us waited for the Go runtime's start", deferred)
}

// TestPrivilegedSIGHUPIsIgnored: SIGHUP does not stop the agent (before or
// after it started); SIGTERM then stops it cleanly.
func TestPrivilegedSIGHUPIsIgnored(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	p := startAgentProcess(t, agentCommand(newAgentDirs(t).args()...))
	require.Eventually(t, func() bool { caught, _ := signalsCaught(p.cmd.Process.Pid); return caught },
		5*time.Second, 100*time.Microsecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	p.waitStarted(t)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	time.Sleep(500 * time.Millisecond)
	require.False(t, p.hasExited(), "agent exited after SIGHUP: %v\n%s", p.err, p.log)
	p.stop(t)
}

// TestPrivilegedClosedOutputDoesNotKill: the agent's stdout and stderr are a
// pipe whose reader goes away once it has started. Its log lines then fail
// (EPIPE) instead of killing it with SIGPIPE: it keeps running and serving
// (a policy file change logs, the shell answers) and exits 0 on SIGTERM,
// which logs too.
func TestPrivilegedClosedOutputDoesNotKill(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	policyDir := t.TempDir()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd := agentCommand(dirs.args("--policy-dir=" + policyDir)...)
	cmd.Stdout, cmd.Stderr = w, w
	p := startAgentProcess(t, cmd)
	w.Close()
	go func() {
		// Copy the output until "Started hive", then close the reader.
		buf := make([]byte, 4096)
		for !strings.Contains(p.log.String(), "Started hive") {
			n, err := r.Read(buf)
			p.log.Write(buf[:n])
			if err != nil {
				break
			}
		}
		r.Close()
	}()
	p.waitStarted(t)
	require.Eventually(t, func() bool {
		_, err := r.Read(make([]byte, 1))
		return err != nil
	}, 5*time.Second, 10*time.Millisecond, "reader closed")

	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "p.yaml"),
		[]byte("name: p\negress:\n  - toCIDR: [\"10.9.9.9/32\"]\n"), 0o600))
	require.Eventually(t, func() bool {
		stdout, _, code := runAgentCommand(t, "shell", "--shell-sock-path="+dirs.sockPath(), "policy/list")
		return code == 0 && strings.Contains(stdout, "p")
	}, 10*time.Second, 100*time.Millisecond, "the agent serves the shell with its output gone")
	require.False(t, p.hasExited(), "agent exited with its output closed: %v", p.err)
	p.stop(t)
}
