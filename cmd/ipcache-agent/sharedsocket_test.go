// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

func socketInode(t *testing.T, path string) uint64 {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	return info.Sys().(*syscall.Stat_t).Ino
}

// requireTouchedNothing: an agent on d that was refused made no pins, no
// checkpoint.
func requireTouchedNothing(t *testing.T, d agentDirs) {
	t.Helper()
	require.NoDirExists(t, bpfmaps.PinDir(d.bpfRoot), "no pins")
	require.NoFileExists(t, filepath.Join(d.stateDir, identitycell.CheckpointFileName), "no checkpoint")
}

// TestPrivilegedSecondAgentSameSocketExitsOne: an agent of another state
// directory and bpffs root but the same --shell-sock-path as a running one
// exits 1 naming the running agent's pid, before it touches anything: the
// first one keeps its socket and serves. Once the first one stopped, the
// second starts on that path.
func TestPrivilegedSecondAgentSameSocketExitsOne(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	first := startAgentProcess(t, agentCommand(dirs.args()...))
	first.waitStarted(t)
	requireServes(t, dirs)
	inode := socketInode(t, dirs.sockPath())

	other := newAgentDirs(t)
	secondArgs := other.args("--shell-sock-path=" + dirs.sockPath())
	refused := startAgentProcess(t, agentCommand(secondArgs...))
	// Started, it would run until stopped: this fails within its wait.
	refused.requireExit(t, agentcmd.ExitFailure)
	requireFailure(t, refused.log.String(), agentcmd.ExitFailure, "--shell-sock-path "+dirs.sockPath(),
		"owned by another running agent", "pid "+strconv.Itoa(first.cmd.Process.Pid))
	requireTouchedNothing(t, other)
	require.Equal(t, inode, socketInode(t, dirs.sockPath()), "the first agent's socket")
	require.False(t, first.hasExited())
	requireServes(t, dirs)

	first.stop(t)
	second := startAgentProcess(t, agentCommand(secondArgs...))
	second.waitStarted(t)
	requireServes(t, dirs)
	second.stop(t)
}

// TestPrivilegedLiveSocketWithoutLockNotStolen: a socket someone listens on
// though nobody holds its lock (an agent of a version that takes none) is
// not removed: the agent exits 1 naming the listener's pid.
func TestPrivilegedLiveSocketWithoutLockNotStolen(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	require.NoError(t, os.MkdirAll(dirs.stateDir, 0o700))
	l, err := net.Listen("unix", dirs.sockPath())
	require.NoError(t, err)
	defer l.Close()
	inode := socketInode(t, dirs.sockPath())

	refused := startAgentProcess(t, agentCommand(dirs.args()...))
	refused.requireExit(t, agentcmd.ExitFailure)
	requireFailure(t, refused.log.String(), agentcmd.ExitFailure, "--shell-sock-path "+dirs.sockPath(),
		"owned by another running agent", "pid "+strconv.Itoa(os.Getpid())+", listening on it")
	require.NoDirExists(t, bpfmaps.PinDir(dirs.bpfRoot), "no pins")
	require.Equal(t, inode, socketInode(t, dirs.sockPath()), "the listener's socket")

	// A stale socket, nobody listening: removed and listened on again.
	l.Close()
	agent := startAgentProcess(t, agentCommand(dirs.args()...))
	agent.waitStarted(t)
	requireServes(t, dirs)
	agent.stop(t)
}
