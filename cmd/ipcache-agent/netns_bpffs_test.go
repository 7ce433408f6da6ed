// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// agentInMountNamespace is the agent with args in a mount namespace of its
// own, private, as `ip netns exec` makes (which also makes it a slave of
// the host's: no difference to what the agent mounts there).
func agentInMountNamespace(args ...string) *exec.Cmd {
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", agentBinary()}, args...)...)
	cmd.Env = append(os.Environ(), beAgentEnv+"=1")
	return cmd
}

// mountedAt reports whether the test's (the host's) mount namespace has a
// mount at path.
func mountedAt(t *testing.T, path string) bool {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(info), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && fields[4] == path {
			return true
		}
	}
	return false
}

// TestPrivilegedNetnsBPFFSRefused: from a mount namespace of its own, the
// agent does not mount bpffs on a --bpf-root that is not one (it would go,
// with the pins and the enforcement, when the agent stops): it exits 1
// saying why and what to do, and nothing is mounted or pinned there.
func TestPrivilegedNetnsBPFFSRefused(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	d := newAgentDirs(t)
	a := startAgentProcess(t, agentInMountNamespace(d.args()...))
	a.requireExit(t, agentcmd.ExitFailure)
	log := a.log.String()
	require.Contains(t, log, "--bpf-root "+d.bpfRoot+" is not a bpffs mount, and "+bpfmaps.ErrPrivateMountNamespace.Error())
	require.Contains(t, log, "would go when the agent stops")
	require.Contains(t, log, "(mount -t bpf bpf "+d.bpfRoot+")")
	require.NotContains(t, log, "Mounted bpffs")
	require.False(t, mountedAt(t, d.bpfRoot), "nothing mounted in the host's namespace")
	_, err := os.Stat(d.bpfRoot)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing made, so nothing pinned, at --bpf-root")
}

// TestPrivilegedNetnsBPFFSDefaultRefused: under `ip netns exec`, which
// mounts a sysfs of its own on /sys, the default --bpf-root (/sys/fs/bpf)
// is never bpffs, whatever the host has mounted there: the agent says to
// give one outside /sys.
func TestPrivilegedNetnsBPFFSDefaultRefused(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	ns := fmt.Sprintf("ipcabpffs%d", os.Getpid())
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	d := newAgentDirs(t)
	cmd := exec.Command("ip", "netns", "exec", ns, agentBinary(), "--state-dir="+d.stateDir, "--shell-sock-path="+d.sockPath())
	cmd.Env = append(os.Environ(), beAgentEnv+"=1")
	a := startAgentProcess(t, cmd)
	a.requireExit(t, agentcmd.ExitFailure)
	require.Contains(t, a.log.String(), "--bpf-root "+bpfmaps.DefaultRoot+" is not a bpffs mount, and "+
		bpfmaps.ErrPrivateMountNamespace.Error())
	require.Contains(t, a.log.String(), "Mount bpffs on a directory outside /sys in the host's mount namespace first")
}

// TestPrivilegedNetnsBPFFSMountedFirst: with bpffs mounted at --bpf-root
// in the host's mount namespace first, the agent runs from a namespace of
// its own as from the host's, and its pins stay in the host's namespace
// once it stops.
func TestPrivilegedNetnsBPFFSMountedFirst(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	d := newAgentDirs(t)
	require.NoError(t, privileged.MountBPFFS(t, d.bpfRoot))
	a := startAgentProcess(t, agentInMountNamespace(d.args()...))
	a.waitStarted(t)
	a.stop(t)
	require.NotContains(t, a.log.String(), "Mounted bpffs")
	require.FileExists(t, filepath.Join(bpfmaps.PinDir(d.bpfRoot), bpfmaps.IPCacheName),
		"the pins outlive the agent, in the host's namespace")
	require.True(t, mountedAt(t, d.bpfRoot))
}
