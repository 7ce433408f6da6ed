// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/agentcmd/stopsignal"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/parallel"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// The test binary doubles as the agent binary: with this variable set it
// runs main instead of the tests, so the tests see real exit codes, signals
// and output.
const beAgentEnv = "IPCACHE_AGENT_TEST_BE_AGENT"

// agentUmaskEnv, with beAgentEnv, is the umask (octal) the agent starts
// with. It is set in the agent's process, before main: the test process's
// umask is shared by the tests running in parallel, and by the files they
// create and the other agents they start.
const agentUmaskEnv = "IPCACHE_AGENT_TEST_UMASK"

// TestMain runs the agent (see beAgentEnv), or the tests, failing them if
// any goroutine outlives them (a child process not waited for leaves the
// goroutines that copy its output). The tests get the default signal
// behaviour back (package stopsignal set it up in this process too): Ctrl-C
// stops them, and the agents they start do not inherit SIGHUP ignored,
// which would hide whether the agent ignores it itself.
func TestMain(m *testing.M) {
	if os.Getenv(beAgentEnv) != "" {
		if umask := os.Getenv(agentUmaskEnv); umask != "" {
			mask, err := strconv.ParseUint(umask, 8, 32)
			if err != nil {
				panic(fmt.Sprintf("%s=%q: %v", agentUmaskEnv, umask, err))
			}
			syscall.Umask(int(mask))
		}
		main()
	}
	stopsignal.Release()
	defaultSIGHUP()
	parallel.AtLeast(minParallel)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		agentBuild.remove()
		os.Exit(code)
	}))
}

// agentRaceEnv, set to 1, has the agents the tests start run as the test
// binary itself even when it has the race detector (see agentBinary).
const agentRaceEnv = "IPCACHE_AGENT_TEST_AGENT_RACE"

// agentBuild is the agent binary the tests start, built once (agentBinary).
var agentBuild builtAgent

type builtAgent struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// agentBinary is the binary the tests start as the agent (with beAgentEnv)
// and as its client commands. It is this test binary, unless this one has
// the race detector: then it is the same package's test binary built
// without it, once per run. The agents are the shipped build's code, as
// the tests that measure memory and upgrades build it (buildAgent); the
// race detector made every agent several times slower and most of the
// package's CPU, and what the agents run is raced in-process by the cells'
// own tests and test/soak's whole control plane. agentRaceEnv=1 runs them
// raced too.
func agentBinary() string {
	if !raceEnabled || os.Getenv(agentRaceEnv) == "1" {
		return os.Args[0]
	}
	b := &agentBuild
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "ipcache-agent-test-agent-"); b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, "ipcache-agent.test")
		out, err := exec.Command("go", "test", "-c", "-o", b.path, ".").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go test -c (the agent without the race detector): %w: %s", err, out)
		}
	})
	if b.err != nil {
		panic(b.err)
	}
	return b.path
}

func (b *builtAgent) remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// minParallel is how many tests of this package run at once unless
// -test.parallel says otherwise: they spend most of their time waiting on
// agents, grace periods and probes rather than on the CPU, so the default
// (GOMAXPROCS, two cores in CI) leaves the machine idle.
const minParallel = 4

// defaultSIGHUP sets SIGHUP's disposition to SIG_DFL, which os/signal
// cannot do once it has ignored it. Nothing in the test process handles
// SIGHUP, so the runtime has nothing to lose; an all-zero sigaction is
// SIG_DFL whatever the architecture's layout.
func defaultSIGHUP() {
	var action [64]byte
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGHUP),
		uintptr(unsafe.Pointer(&action)), 0, 8, 0, 0); errno != 0 {
		panic(fmt.Sprintf("rt_sigaction(SIGHUP, SIG_DFL): %v", errno))
	}
}

func agentCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(agentBinary(), args...)
	cmd.Env = append(os.Environ(), beAgentEnv+"=1")
	return cmd
}

func runAgentCommand(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runAgentCommandEnv(t, nil, args...)
}

// runAgentCommandEnv is runAgentCommand with more environment variables.
func runAgentCommandEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := agentCommand(args...)
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if exitErr, ok := err.(*exec.ExitError); ok {
		return out.String(), errOut.String(), exitErr.ExitCode()
	}
	require.NoError(t, err)
	return out.String(), errOut.String(), 0
}

func TestBadFlagsExitTwoNamingTheFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--identity-restore-grace-period=x"}, "--identity-restore-grace-period"},
		{[]string{"--identity-restore-grace-period=-5s"}, "--identity-restore-grace-period"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--log-format=xml"}, "--log-format"},
		{[]string{"--ipcache-map-max-entries=0"}, "--ipcache-map-max-entries"},
		{[]string{"--ipcache-map-max-entries=lots"}, "--ipcache-map-max-entries"},
		{[]string{"--enable-policy=sometimes"}, "--enable-policy"},
		{[]string{"hive", "--enable-policy=Always"}, "--enable-policy"},
		{[]string{"--no-such-flag"}, "--no-such-flag"},
		{[]string{"hive", "--no-such-flag"}, "--no-such-flag"},
		{[]string{"unexpected-argument"}, "unexpected-argument"},
	} {
		_, stderr, code := runAgentCommand(t, tc.args...)
		require.Equal(t, agentcmd.ExitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

// TestEnablePolicyFromEnvironment: IPCACHE_AGENT_ENABLE_POLICY goes
// through the flag's validation: a bad value exits 2 naming the flag and
// the variable, a good one is the configuration.
func TestEnablePolicyFromEnvironment(t *testing.T) {
	t.Parallel()
	run := func(value string, args ...string) (string, string, int) {
		return runAgentCommandEnv(t, []string{"IPCACHE_AGENT_ENABLE_POLICY=" + value}, args...)
	}
	_, stderr, code := run("sometimes", "hive")
	require.Equal(t, agentcmd.ExitUsage, code, stderr)
	require.Contains(t, stderr, `IPCACHE_AGENT_ENABLE_POLICY="sometimes": --enable-policy "sometimes": want default, always or never`,
		"names the variable too")
	require.Equal(t, 1, strings.Count(stderr, "want default, always or never"), "the error once: %s", stderr)
	_, stderr, code = run("sometimes")
	require.Equal(t, agentcmd.ExitUsage, code, stderr)
	require.Equal(t, 1, strings.Count(stderr, "want default, always or never"), "the agent's error once: %s", stderr)
	stdout, stderr, code := run("never", "hive")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Contains(t, stdout, "EnablePolicy: (string) (len=5) \"never\"")
}

func TestHiveListsIdentityModuleAndConfig(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runAgentCommand(t, "hive")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	for _, want := range []string{"identity (Local CIDR identity allocation)", "ipcache (", "datapath (", "datapathcell.Config", "identitycell.Config", "StateDir", "IdentityRestoreGracePeriod: (time.Duration) 10m0s", "Start hooks"} {
		require.Contains(t, stdout, want)
	}
}

func TestHiveDotGraph(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runAgentCommand(t, "hive", "dot-graph")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.True(t, strings.HasPrefix(stdout, "digraph {"), stdout)
	require.Contains(t, stdout, "identitycell.Allocator")
}

func TestHelpDescribesFlags(t *testing.T) {
	t.Parallel()
	stdout, _, code := runAgentCommand(t, "--help")
	require.Equal(t, agentcmd.ExitOK, code)
	for _, flag := range []string{"--state-dir", "--identity-restore-grace-period", "--log-level", "--log-format",
		"--bpf-root", "--devices", "--ipcache-map-max-entries", "--policy-map-max-entries", "--enable-policy"} {
		require.Contains(t, stdout, flag)
	}
	require.NotContains(t, stdout, "identity-local-space-size", "test-only flags are hidden")
}

// TestRunStopsCleanlyOnSignal runs the agent on a private state directory
// and stops it, once initialized, with SIGTERM and with SIGINT: both are a
// clean stop (exit 0) that leaves the identity checkpoint behind.
func TestRunStopsCleanlyOnSignal(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		stateDir := filepath.Join(t.TempDir(), "state")
		bpfRoot := filepath.Join(t.TempDir(), "bpf")
		t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
		cmd := agentCommand("--state-dir="+stateDir, "--bpf-root="+bpfRoot, "--log-format=json",
			"--shell-sock-path="+filepath.Join(stateDir, "shell.sock"))
		var stderr syncbuf.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		// Initialized, not only started: until every producer (restore
		// last) has spoken, the checkpoint job keeps the previous run's
		// checkpoint rather than write a partial one, and a first run has
		// none. A stop right after "Started hive" raced with that.
		require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "ipcache table initialized") },
			10*time.Second, 10*time.Millisecond, "agent did not start: %s", &stderr)
		require.NoError(t, cmd.Process.Signal(sig))
		err := cmd.Wait()
		require.NoError(t, err, "exit after %s: %s", sig, &stderr)
		require.Contains(t, stderr.String(), `"msg":"Stopped hive"`, "logs are JSON")
		_, err = os.Stat(filepath.Join(stateDir, "local-identities.json"))
		require.NoError(t, err, "checkpoint written")
		_, err = os.Stat(filepath.Join(bpfRoot, "ipcache-agent", "ipcache"))
		require.NoError(t, err, "ipcache map stays pinned after the agent stops")
	}
}

// TestPolicyDirNotADirectoryExitsTwo: a --policy-dir that is a file (or a
// symlink to one) is bad configuration: exit 2 at start, naming the flag.
func TestPolicyDirNotADirectoryExitsTwo(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "policies.yaml")
	require.NoError(t, os.WriteFile(file, []byte("name: p\n"), 0o600))
	link := filepath.Join(t.TempDir(), "policies")
	require.NoError(t, os.Symlink(file, link))
	for _, dir := range []string{file, link} {
		stateDir := t.TempDir()
		_, stderr, code := runAgentCommand(t, "--policy-dir="+dir, "--state-dir="+stateDir, "--shell-sock-path=")
		require.Equal(t, agentcmd.ExitUsage, code, stderr)
		require.Contains(t, stderr, "--policy-dir "+dir+": not a directory")
		_, err := os.Stat(filepath.Join(stateDir, "owner.lock"))
		require.ErrorIs(t, err, os.ErrNotExist, "nothing started")
	}
}

// TestShellWithoutAgentFailsFast: `shell` with no agent on the socket exits
// 1 at once, with one message naming the socket.
func TestShellWithoutAgentFailsFast(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "shell.sock")
	for _, args := range [][]string{{"health"}, nil} {
		start := time.Now()
		stdout, stderr, code := runAgentCommand(t, append([]string{"shell", "--shell-sock-path=" + sock}, args...)...)
		require.Equal(t, agentcmd.ExitFailure, code, stderr)
		require.Less(t, time.Since(start), 5*time.Second, "no retries")
		require.Equal(t, 1, strings.Count(stdout+stderr, "no agent is listening on "+sock), "once: %s%s", stdout, stderr)
	}
}

func TestRuntimeFailureExitsOne(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, stderr, code := runAgentCommand(t, "--state-dir="+filepath.Join(file, "state"), "--shell-sock-path=")
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Contains(t, stderr, "create state directory")
}
