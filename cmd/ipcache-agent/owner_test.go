// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// untouched is what a second agent must not change of the first one's:
// the pinned ipcache map, the checkpoint and the shell socket.
type untouched struct {
	ipcacheMap uint32
	checkpoint time.Time
	socket     uint64
}

// observe waits for the agent's first checkpoint (written once it
// started) and reads what must stay untouched.
func observe(t *testing.T, d agentDirs) untouched {
	t.Helper()
	id, err := ebpfMapInfo(d.bpfRoot)
	require.NoError(t, err)
	var checkpoint os.FileInfo
	require.Eventually(t, func() bool {
		checkpoint, err = os.Stat(filepath.Join(d.stateDir, identitycell.CheckpointFileName))
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "checkpoint written")
	socket, err := os.Stat(d.sockPath())
	require.NoError(t, err)
	return untouched{uint32(id), checkpoint.ModTime(), socket.Sys().(*syscall.Stat_t).Ino}
}

// requireServes checks that the agent on d answers its shell, healthy.
func requireServes(t *testing.T, d agentDirs) {
	t.Helper()
	stdout, stderr, code := runAgentCommand(t, "shell", "--shell-sock-path="+d.sockPath(), "health")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Regexp(t, `datapath.job-reconcile-ipcache: level=OK`, stdout)
	require.NotContains(t, stdout, "Degraded")
}

// TestPrivilegedSecondAgentExitsOne: a second agent on the same state
// directory, or on another one with the same bpffs root, exits 1 naming the
// running agent's pid, and leaves its maps, checkpoint and socket alone;
// the first one keeps running, healthy.
func TestPrivilegedSecondAgentExitsOne(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	first := startAgentProcess(t, agentCommand(dirs.args()...))
	first.waitStarted(t)
	requireServes(t, dirs)
	before := observe(t, dirs)
	pid := "pid " + strconv.Itoa(first.cmd.Process.Pid)
	lock, err := os.ReadFile(filepath.Join(dirs.stateDir, cells.OwnerLockFileName))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(first.cmd.Process.Pid)+"\n", string(lock), "the lock file holds the owner's pid")

	otherState := filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"same state directory and bpffs root", dirs.args(), "--state-dir " + dirs.stateDir},
		{"same state directory, another bpffs root", dirs.args("--bpf-root=" + newAgentDirs(t).bpfRoot), "--state-dir " + dirs.stateDir},
		{"another state directory, same bpffs root", dirs.args("--state-dir="+otherState,
			"--shell-sock-path="+filepath.Join(otherState, "shell.sock")), "--bpf-root " + dirs.bpfRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runAgentCommand(t, tc.args...)
			requireFailure(t, stderr, code, tc.want, "owned by another running agent", pid)
			require.Equal(t, before, observe(t, dirs), "the first agent's map, checkpoint and socket")
			require.False(t, first.hasExited())
			requireServes(t, dirs)
		})
	}
	first.stop(t)
}

// TestPrivilegedCleanupRefusedWhileAgentRuns: cleanup exits 1 naming the
// running agent's pid and removes nothing; once the agent stopped, it
// cleans up.
func TestPrivilegedCleanupRefusedWhileAgentRuns(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	agent := startAgentProcess(t, agentCommand(dirs.args()...))
	agent.waitStarted(t)
	before := observe(t, dirs)

	cleanup := []string{"cleanup", "--bpf-root=" + dirs.bpfRoot, "--state-dir=" + dirs.stateDir}
	_, stderr, code := runAgentCommand(t, cleanup...)
	requireFailure(t, stderr, code, "owned by another running agent", "pid "+strconv.Itoa(agent.cmd.Process.Pid))
	require.Equal(t, before, observe(t, dirs), "nothing removed")
	requireServes(t, dirs)

	agent.stop(t)
	stdout, stderr, code := runAgentCommand(t, cleanup...)
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Contains(t, stdout, "Removed")
	for _, path := range []string{filepath.Join(dirs.bpfRoot, "ipcache-agent"),
		filepath.Join(dirs.stateDir, identitycell.CheckpointFileName), filepath.Join(dirs.stateDir, cells.OwnerLockFileName)} {
		_, err := os.Stat(path)
		require.ErrorIs(t, err, os.ErrNotExist, path)
	}
}

// TestPrivilegedKilledAgentDoesNotBlock: the locks of a SIGKILLed agent go
// with it; the next agent on the same directories starts and stops cleanly.
func TestPrivilegedKilledAgentDoesNotBlock(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	killed := startAgentProcess(t, agentCommand(dirs.args()...))
	killed.waitStarted(t)
	require.NoError(t, killed.cmd.Process.Signal(syscall.SIGKILL))
	<-killed.exited

	next := startAgentProcess(t, agentCommand(dirs.args()...))
	next.waitStarted(t)
	requireServes(t, dirs)
	next.stop(t)
}
