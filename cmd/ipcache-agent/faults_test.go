// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// The faults of docs/FAULTS.md that need the real binary: a bad --bpf-root
// or --state-dir, a corrupt checkpoint, incompatible pins, and the modes of
// what the agent creates. Each run of the agent is a child process; what it
// prints is checked for a clear message and the absence of a panic.

// faultAgentTimeout bounds every run of the agent in these tests (-race,
// two shared cores).
const faultAgentTimeout = 30 * time.Second

// faultRig is a private bpffs mount point, state and policy directory.
type faultRig struct {
	t                            *testing.T
	bpfRoot, stateDir, policyDir string
}

func newFaultRig(t *testing.T) *faultRig {
	privileged.Test(t)
	r := &faultRig{
		t:         t,
		bpfRoot:   filepath.Join(t.TempDir(), "bpf"),
		stateDir:  filepath.Join(t.TempDir(), "state"),
		policyDir: t.TempDir(),
	}
	t.Cleanup(func() { unix.Unmount(r.bpfRoot, unix.MNT_DETACH) })
	return r
}

// inFreshNetns makes cmd run in a network namespace of its own, made for
// it and deleted when the test ends, which has no address: the host
// entity's addresses (every address of the agent's namespace) would be
// entries of the pinned ipcache map that the tests count. nsenter enters
// the network namespace only (the agent mounts bpffs where the test sees
// it) and execs cmd, so the process is the agent.
func inFreshNetns(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	ns := "ipca-" + filepath.Base(filepath.Dir(dir)) + "-" + filepath.Base(dir)
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, "ip netns add %s: %s", ns, out)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	cmd.Args = append([]string{"nsenter", "--net=/run/netns/" + ns, "--"}, cmd.Args...)
	cmd.Path, cmd.Err = exec.LookPath("nsenter")
	return cmd
}

// args are the agent's flags on the rig, then extra (later flags win).
func (r *faultRig) args(extra ...string) []string {
	return append([]string{"--bpf-root=" + r.bpfRoot, "--state-dir=" + r.stateDir,
		"--policy-dir=" + r.policyDir, "--shell-sock-path=", "--identity-restore-grace-period=1h"}, extra...)
}

// mountBPFFS mounts bpffs at the rig's --bpf-root, as a previous agent (or
// the system) would have.
func (r *faultRig) mountBPFFS(flags uintptr) {
	r.t.Helper()
	require.NoError(r.t, os.MkdirAll(r.bpfRoot, 0o700))
	require.NoError(r.t, unix.Mount("bpf", r.bpfRoot, "bpf", flags, "mode=0700"))
}

func (r *faultRig) pin(name string) string { return filepath.Join(r.bpfRoot, "ipcache-agent", name) }

func (r *faultRig) writePolicy(cidrs ...string) {
	r.t.Helper()
	policy := "name: faults\negress:\n  - toCIDR: [\"" + strings.Join(cidrs, "\", \"") + "\"]\n"
	require.NoError(r.t, os.WriteFile(filepath.Join(r.policyDir, "faults.yaml"), []byte(policy), 0o600))
}

// runFailing runs the agent, which must fail to start: it returns its
// output (stdout and stderr) and exit code.
func runFailing(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := inFreshNetns(t, agentCommand(args...))
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return out.String(), exitErr.ExitCode()
		}
		require.NoError(t, err)
		return out.String(), 0
	case <-time.After(faultAgentTimeout):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("agent did not exit: %s", &out)
		return "", 0
	}
}

// faultAgent is an agent process that started.
type faultAgent struct {
	t   *testing.T
	cmd *exec.Cmd
	log *syncbuf.Buffer
}

// startAgent runs the agent until it has started, with umask 0
// (agentUmaskEnv): what it creates must not depend on the umask it is
// started with.
func startAgent(t *testing.T, args ...string) *faultAgent {
	t.Helper()
	cmd := agentCommand(args...)
	if !slices.ContainsFunc(args, func(arg string) bool { return strings.HasPrefix(arg, "--devices=") }) {
		// An agent attached to a device runs where the device is.
		cmd = inFreshNetns(t, cmd)
	}
	a := &faultAgent{t: t, cmd: cmd, log: &syncbuf.Buffer{}}
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.Env = append(a.cmd.Env, agentUmaskEnv+"=0")
	require.NoError(t, a.cmd.Start())
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			a.cmd.Process.Kill()
			a.cmd.Wait()
		}
	})
	waitAgentStarted(t, a.log, a.cmd.Process.Pid)
	return a
}

// stop stops the agent with SIGTERM: a clean stop, exit 0.
func (a *faultAgent) stop() string {
	a.t.Helper()
	require.NoError(a.t, a.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(a.t, a.cmd.Wait(), "exit after SIGTERM: %s", a.log)
	requireNoPanic(a.t, a.log.String())
	return a.log.String()
}

var goroutineTrace = regexp.MustCompile(`goroutine \d+ \[`)

// requireNoPanic fails if the output holds a panic or a stack trace.
func requireNoPanic(t *testing.T, out string) {
	t.Helper()
	require.NotContains(t, out, "panic:", "no panic")
	require.NotRegexp(t, goroutineTrace, out, "no stack trace")
}

// requireFailure checks a start failure: exit code 1, and a last line
// (what the operator reads first) that names the path and the problem.
func requireFailure(t *testing.T, out string, code int, want ...string) {
	t.Helper()
	require.Equal(t, agentcmd.ExitFailure, code, out)
	requireNoPanic(t, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	require.True(t, strings.HasPrefix(last, "ipcache-agent: "), "last line is the error: %q", last)
	for _, w := range want {
		require.Contains(t, last, w, "the error says %q", w)
	}
}

// TestPrivilegedFaultBPFRootMissing: a --bpf-root that does not exist is
// created and bpffs is mounted there; the agent runs and says so.
func TestPrivilegedFaultBPFRootMissing(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.bpfRoot = filepath.Join(r.bpfRoot, "not", "yet")
	t.Cleanup(func() { unix.Unmount(r.bpfRoot, unix.MNT_DETACH) })
	a := startAgent(t, r.args()...)
	require.Regexp(t, `msg="Mounted bpffs".*bpf-root=`+regexp.QuoteMeta(r.bpfRoot), a.log.String())
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(r.bpfRoot, &st))
	require.Equal(t, int64(0xcafe4a11), int64(st.Type), "bpffs mounted at --bpf-root")
	a.stop()
	_, err := os.Stat(r.pin(bpfmaps.IPCacheName))
	require.NoError(t, err, "maps pinned there")
}

// TestPrivilegedFaultBPFRootNotUsable: a --bpf-root that cannot be a bpffs
// mount point, or is a read-only bpffs, fails the start with exit 1 and a
// message naming the path and the problem. Pins a previous run left on a
// bpffs that is now read-only are left as they are.
func TestPrivilegedFaultBPFRootNotUsable(t *testing.T) {
	t.Parallel()
	t.Run("regular file", func(t *testing.T) {
		r := newFaultRig(t)
		require.NoError(t, os.WriteFile(r.bpfRoot, nil, 0o600))
		out, code := runFailing(t, r.args()...)
		requireFailure(t, out, code, "--bpf-root "+r.bpfRoot, "not a directory")
	})
	t.Run("under a regular file", func(t *testing.T) {
		r := newFaultRig(t)
		require.NoError(t, os.WriteFile(r.bpfRoot, nil, 0o600))
		root := filepath.Join(r.bpfRoot, "bpf")
		out, code := runFailing(t, r.args("--bpf-root="+root)...)
		requireFailure(t, out, code, "--bpf-root "+root, "not a directory")
	})
	t.Run("read-only bpffs", func(t *testing.T) {
		r := newFaultRig(t)
		r.mountBPFFS(unix.MS_RDONLY)
		out, code := runFailing(t, r.args()...)
		requireFailure(t, out, code, "--bpf-root "+r.bpfRoot, "read-only", "remount")
	})
	t.Run("read-only bpffs with pins of a previous run", func(t *testing.T) {
		r := newFaultRig(t)
		r.mountBPFFS(0)
		r.writePolicy("10.9.0.0/24", "10.9.1.0/24")
		a := startAgent(t, r.args()...)
		waitPinned(t, r.bpfRoot, 2)
		a.stop()
		before, err := bpfmaps.ReadIPCache(r.bpfRoot)
		require.NoError(t, err)

		require.NoError(t, unix.Mount("", r.bpfRoot, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""))
		out, code := runFailing(t, r.args()...)
		requireFailure(t, out, code, "--bpf-root "+r.bpfRoot, "read-only")
		after, err := bpfmaps.ReadIPCache(r.bpfRoot)
		require.NoError(t, err)
		require.Equal(t, before, after, "the pinned map is untouched")
	})
}

// TestPrivilegedFaultStateDirUnwritable: a --state-dir that cannot be
// created or written (root ignores permission bits: a read-only bind mount,
// a path through a regular file), or whose checkpoint cannot be read,
// fails the start with exit 1 and a message naming the path and the
// problem.
func TestPrivilegedFaultStateDirUnwritable(t *testing.T) {
	t.Parallel()
	// readOnly returns a directory that is a read-only bind mount of
	// itself, holding a valid checkpoint.
	readOnly := func(t *testing.T) string {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, identitycell.CheckpointFileName),
			[]byte(`{"version":1,"identities":[]}`), 0o600))
		require.NoError(t, unix.Mount(dir, dir, "", unix.MS_BIND, ""))
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		require.NoError(t, unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""))
		return dir
	}
	for _, tc := range []struct {
		name     string
		stateDir func(t *testing.T) string
		want     []string
	}{
		{"existing, on a read-only mount", readOnly, []string{"is not writable", "read-only file system"}},
		{"to be created on a read-only mount", func(t *testing.T) string {
			return filepath.Join(readOnly(t), "state")
		}, []string{"create state directory", "read-only file system"}},
		{"a regular file", func(t *testing.T) string {
			file := filepath.Join(t.TempDir(), "state")
			require.NoError(t, os.WriteFile(file, nil, 0o600))
			return file
		}, []string{"create state directory", "not a directory"}},
		{"under a regular file", func(t *testing.T) string {
			file := filepath.Join(t.TempDir(), "file")
			require.NoError(t, os.WriteFile(file, nil, 0o600))
			return filepath.Join(file, "state")
		}, []string{"create state directory", "not a directory"}},
		{"checkpoint is a directory", func(t *testing.T) string {
			dir := t.TempDir()
			require.NoError(t, os.Mkdir(filepath.Join(dir, identitycell.CheckpointFileName), 0o700))
			return dir
		}, []string{"read identity checkpoint", identitycell.CheckpointFileName, "is a directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFaultRig(t)
			r.stateDir = tc.stateDir(t)
			out, code := runFailing(t, r.args()...)
			requireFailure(t, out, code, append([]string{r.stateDir}, tc.want...)...)
			require.Contains(t, out, "--state-dir")
		})
	}
}

// TestPrivilegedFaultCorruptCheckpoint: a corrupt checkpoint is moved aside
// (kept, for a human) with a clear log line, the agent starts, restores the
// same numbers from the pinned map (with cidr labels), and writes a good
// checkpoint again.
func TestPrivilegedFaultCorruptCheckpoint(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.writePolicy("10.8.0.0/24", "10.8.1.0/24")
	a := startAgent(t, r.args()...)
	waitPinned(t, r.bpfRoot, 2)
	a.stop()
	before, err := bpfmaps.ReadIPCache(r.bpfRoot)
	require.NoError(t, err)

	checkpoint := filepath.Join(r.stateDir, identitycell.CheckpointFileName)
	garbage := []byte(`{"version":1,"identities":[{"id":`)
	require.NoError(t, os.WriteFile(checkpoint, garbage, 0o600))

	a = startAgent(t, r.args()...)
	require.Regexp(t, `level=ERROR msg="Identity checkpoint is corrupt; moved aside, restoring without its labels" `+
		`module=identity path=`+regexp.QuoteMeta(checkpoint)+` moved-to=`+regexp.QuoteMeta(checkpoint+".corrupt")+` error=`, a.log.String())
	require.Eventually(t, func() bool { return strings.Contains(a.log.String(), "Restored prefixes from the pinned ipcache map") },
		30*time.Second, 10*time.Millisecond, "restored after the start")
	aside, err := os.ReadFile(checkpoint + ".corrupt")
	require.NoError(t, err)
	require.Equal(t, garbage, aside, "the corrupt file is kept aside")
	a.stop()

	after, err := bpfmaps.ReadIPCache(r.bpfRoot)
	require.NoError(t, err)
	require.Equal(t, before, after, "same identity numbers")
	saved, err := identitycell.ReadCheckpoint(checkpoint)
	require.NoError(t, err, "a good checkpoint is written again")
	for prefix, id := range before {
		lbls, _ := saved.Labels(identity.Number(id))
		require.Equal(t, "cidr:"+prefix.String(), lbls.String())
	}
}

// TestPrivilegedFaultIncompatiblePins: a pinned map of another layout, and
// a pin that is not a map at all, are each reported (naming the pin and the
// difference) and replaced; the agent starts and its maps work.
func TestPrivilegedFaultIncompatiblePins(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.mountBPFFS(0)
	require.NoError(t, os.MkdirAll(filepath.Dir(r.pin("x")), 0o700))
	wrong, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 4})
	require.NoError(t, err)
	require.NoError(t, wrong.Put(uint64(1), uint64(2)))
	require.NoError(t, wrong.Pin(r.pin(bpfmaps.IPCacheName)))
	wrong.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SocketFilter,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	require.NoError(t, err)
	require.NoError(t, prog.Pin(r.pin(bpfmaps.PolicyName)))
	prog.Close()

	r.writePolicy("10.7.0.0/24")
	a := startAgent(t, r.args()...)
	log := a.log.String()
	require.Regexp(t, `level=WARN msg="Pinned map has another layout; restoring nothing from it and replacing it" `+
		`module=datapath map=`+regexp.QuoteMeta(r.pin(bpfmaps.IPCacheName))+` difference="type Hash, want LPMTrie"`, log)
	require.Regexp(t, `level=WARN msg="Pinned object is not a usable map; restoring nothing from it and replacing it" `+
		`module=datapath map=`+regexp.QuoteMeta(r.pin(bpfmaps.PolicyName))+` error=.*not a Map`, log)
	waitPinned(t, r.bpfRoot, 1)
	require.Eventually(t, func() bool {
		policy, err := bpfmaps.ReadPolicy(r.bpfRoot)
		return err == nil && len(policy) == 1
	}, faultAgentTimeout, 20*time.Millisecond, "the replaced policy map works")
	a.stop()

	for name, typ := range map[string]ebpf.MapType{bpfmaps.IPCacheName: ebpf.LPMTrie, bpfmaps.PolicyName: ebpf.HashOfMaps} {
		m, err := ebpf.LoadPinnedMap(r.pin(name), &ebpf.LoadPinOptions{ReadOnly: true})
		require.NoError(t, err)
		require.Equal(t, typ, m.Type(), name)
		m.Close()
	}
}

// TestPrivilegedFaultMaxEntriesBelowContent: lowering
// --ipcache-map-max-entries below what the pinned map holds cannot migrate
// the map without dropping entries: the start fails (exit 1) naming the
// pin and the flag, and the pinned map is untouched (still enforced).
func TestPrivilegedFaultMaxEntriesBelowContent(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.writePolicy("10.6.0.0/24", "10.6.1.0/24", "10.6.2.0/24")
	a := startAgent(t, r.args()...)
	waitPinned(t, r.bpfRoot, 3)
	a.stop()
	before, err := bpfmaps.ReadIPCache(r.bpfRoot)
	require.NoError(t, err)

	out, code := runFailing(t, r.args("--ipcache-map-max-entries=2")...)
	requireFailure(t, out, code, r.pin(bpfmaps.IPCacheName), "raise --ipcache-map-max-entries", "old map stays pinned")
	after, err := bpfmaps.ReadIPCache(r.bpfRoot)
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing lost")
	_, err = os.Stat(r.pin(bpfmaps.IPCacheName + "_new"))
	require.ErrorIs(t, err, os.ErrNotExist, "no temporary pin left")

	// Raised again, the agent starts over the same map.
	a = startAgent(t, r.args("--ipcache-map-max-entries=3")...)
	a.stop()
	after, err = bpfmaps.ReadIPCache(r.bpfRoot)
	require.NoError(t, err)
	require.Equal(t, before, after)
}

// TestPrivilegedPinsAndStateArePrivate: whatever umask the agent is started
// with, and even when the pin directory existed with a wider mode, the
// pins (maps and TCX links) and their directories are not writable by
// group or others, the state directory is created 0700 and the checkpoint
// is 0600.
func TestPrivilegedPinsAndStateArePrivate(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	device := addRootVeth(t, "ipcaf")
	_, err := net.InterfaceByName(device)
	require.NoError(t, err)
	r.mountBPFFS(0)
	require.NoError(t, os.Mkdir(filepath.Dir(r.pin("x")), 0o777))
	require.NoError(t, os.Chmod(filepath.Dir(r.pin("x")), 0o777), "a pin directory made by someone else")
	r.stateDir = filepath.Join(t.TempDir(), "run", "ipcache-agent")

	a := startAgent(t, r.args("--devices="+device)...)
	// The checkpoint is written once the tables are initialized, which
	// "Started hive" does not mean (restore speaks after the other
	// producers): stopped before, a first run leaves none (CI, once).
	checkpoint := filepath.Join(r.stateDir, identitycell.CheckpointFileName)
	require.Eventually(t, func() bool { _, err := os.Stat(checkpoint); return err == nil },
		faultAgentTimeout, 10*time.Millisecond, "checkpoint written: %s", a.log)
	a.stop()
	t.Cleanup(func() { agentCommand("cleanup", "--bpf-root="+r.bpfRoot, "--state-dir="+r.stateDir).Run() })

	pins := []string{"", "links", bpfmaps.IPCacheName, bpfmaps.PolicyName,
		bpfmaps.EnforcementName, bpfmaps.CountersName, bpfmaps.ConntrackName, bpfmaps.RevisionName,
		"links/" + device + "-ingress", "links/" + device + "-egress"}
	for _, name := range pins {
		info, err := os.Stat(r.pin(name))
		require.NoError(t, err, name)
		require.Zero(t, info.Mode().Perm()&0o022, "%s (mode %v) is writable by group or others", r.pin(name), info.Mode())
		if !info.IsDir() {
			require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "pin %s", name)
		}
	}
	info, err := os.Stat(r.pin(""))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "pin directory made private")

	for _, dir := range []string{r.stateDir, filepath.Dir(r.stateDir)} {
		info, err := os.Stat(dir)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "state directory %s created 0700", dir)
	}
	info, err = os.Stat(checkpoint)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "checkpoint file")
}

// waitPinned waits until the pinned ipcache map holds n entries.
func waitPinned(t *testing.T, bpfRoot string, n int) map[netip.Prefix]identity.Number {
	t.Helper()
	var m map[netip.Prefix]identity.Number
	require.Eventually(t, func() bool {
		var err error
		m, err = bpfmaps.ReadIPCache(bpfRoot)
		return err == nil && len(m) == n
	}, faultAgentTimeout, 20*time.Millisecond, "pinned ipcache map: %v", m)
	return m
}

// TestPrivilegedFaultStateDirBecomesReadOnly: when the state directory
// turns read-only while the agent runs, the checkpoint cannot be written:
// that is logged and retried, the previous checkpoint stays whole, the
// datapath is unaffected, and once the directory is writable again the
// checkpoint catches up.
func TestPrivilegedFaultStateDirBecomesReadOnly(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	require.NoError(t, os.MkdirAll(r.stateDir, 0o700))
	require.NoError(t, unix.Mount(r.stateDir, r.stateDir, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(r.stateDir, unix.MNT_DETACH) })
	checkpoint := filepath.Join(r.stateDir, identitycell.CheckpointFileName)
	checkpointed := func(n int) func() bool {
		return func() bool {
			c, err := identitycell.ReadCheckpoint(checkpoint)
			return err == nil && c.Len() == n
		}
	}

	r.writePolicy("10.5.0.0/24")
	a := startAgent(t, r.args()...)
	require.Eventually(t, checkpointed(1), faultAgentTimeout, 20*time.Millisecond)

	require.NoError(t, unix.Mount("", r.stateDir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""))
	r.writePolicy("10.5.0.0/24", "10.5.1.0/24")
	waitPinned(t, r.bpfRoot, 2)
	require.Eventually(t, func() bool {
		return strings.Contains(a.log.String(), `level=ERROR msg="Cannot write identity checkpoint, will retry"`)
	}, faultAgentTimeout, 20*time.Millisecond, "the failed write is logged: %s", a.log)
	require.Regexp(t, `msg="Cannot write identity checkpoint, will retry".*`+regexp.QuoteMeta(r.stateDir)+`.*read-only file system`, a.log.String())
	require.True(t, checkpointed(1)(), "the previous checkpoint is whole")

	require.NoError(t, unix.Mount("", r.stateDir, "", unix.MS_REMOUNT|unix.MS_BIND, ""))
	require.Eventually(t, checkpointed(2), faultAgentTimeout, 20*time.Millisecond, "the checkpoint catches up")
	a.stop()
}
