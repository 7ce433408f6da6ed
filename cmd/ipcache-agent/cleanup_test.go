// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/cnicell"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

func tcxPrograms(t *testing.T, device string, attach ebpf.AttachType) int {
	t.Helper()
	iface, err := net.InterfaceByName(device)
	require.NoError(t, err)
	result, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: attach})
	require.NoError(t, err)
	return len(result.Programs)
}

// addRootVeth adds a veth pair to the root namespace, named prefix and
// this process's id (another test binary running at the same time, or one
// that crashed before its cleanup, has other names), deleted at the end of
// the test; it returns the first device's name.
func addRootVeth(t *testing.T, prefix string) string {
	t.Helper()
	device := fmt.Sprintf("%s%d", prefix, os.Getpid())
	out, err := exec.Command("ip", "link", "add", device, "type", "veth", "peer", "name", device+"p").CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { exec.Command("ip", "link", "del", device).Run() })
	return device
}

// TestCleanupLeavesNothingBehind runs the agent on a veth device, stops it
// (enforcement and maps stay), then runs cleanup: no pinned object, no
// attached program and no state file is left.
func TestCleanupLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	device := addRootVeth(t, "ipcat")
	require.NoError(t, exec.Command("ip", "link", "set", device, "up").Run())

	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	stateDir, policyDir := t.TempDir(), t.TempDir()
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "a.yaml"), []byte("name: a\n"), 0o644))

	cmd := agentCommand("--bpf-root="+bpfRoot, "--state-dir="+stateDir, "--devices="+device,
		"--policy-dir="+policyDir, "--shell-sock-path="+filepath.Join(stateDir, "shell.sock"))
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	waitAgentStarted(t, &stderr, cmd.Process.Pid)
	// The policies in force are saved after the policy goes in force, a
	// moment after the start: under load a stop right after "Started
	// hive" came before the save (CI, once), and cleanup must be shown
	// removing the file.
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(stateDir, policycell.InForceFileName))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "policies in force not saved: %s", &stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), stderr.String())
	require.Contains(t, stderr.String(), "The pins and the enforcement stay after the agent stops; "+
		"`ipcache-agent cleanup` removes them", "the stop says what stays and what removes it")

	pins := filepath.Join(bpfRoot, "ipcache-agent")
	for _, name := range []string{"ipcache", "policy", "enforcement", "counters", "links/" + device + "-ingress", "links/" + device + "-egress"} {
		_, err := os.Stat(filepath.Join(pins, name))
		require.NoError(t, err, "%s pinned after the agent stopped", name)
	}
	require.FileExists(t, filepath.Join(stateDir, policycell.InForceFileName))
	require.Equal(t, 1, tcxPrograms(t, device, ebpf.AttachTCXIngress), "enforcement outlives the agent")
	require.Equal(t, 1, tcxPrograms(t, device, ebpf.AttachTCXEgress))

	stdout, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+bpfRoot, "--state-dir="+stateDir)
	require.Equal(t, agentcmd.ExitOK, code, errOut)
	require.Contains(t, stdout, "Removed")
	require.Contains(t, stdout, "Removed pins: "+pins+" (maps: conntrack, counters, ct_opening, dns-answers, dns-answers-lost, dns-proxy, endpoints, enforcement, "+
		"ipcache, policy, revision; links: "+device+"-egress, "+device+"-ingress)\n")
	require.Contains(t, stdout, "Detached enforcement from: "+device+"\n")
	require.Contains(t, stdout, "Unmounted bpffs at "+bpfRoot+" (mounted by the agent)\n")
	require.Contains(t, stdout, "Removed directory "+bpfRoot+" (made by the agent)\n")
	require.Contains(t, stdout, "Removed state from "+stateDir+": "+identitycell.CheckpointFileName+", "+
		policycell.InForceFileName+", "+cells.BPFFSMountFileName+", "+cells.OwnerLockFileName+"\n")
	require.False(t, mountedAt(t, bpfRoot), "the bpffs the agent mounted is unmounted")
	_, err := os.Stat(pins)
	require.ErrorIs(t, err, os.ErrNotExist, "no pinned object left")
	require.Zero(t, tcxPrograms(t, device, ebpf.AttachTCXIngress), "program detached")
	require.Zero(t, tcxPrograms(t, device, ebpf.AttachTCXEgress))
	_, err = os.Stat(filepath.Join(stateDir, "local-identities.json"))
	require.ErrorIs(t, err, os.ErrNotExist, "checkpoint removed")
	_, err = os.Stat(filepath.Join(stateDir, policycell.InForceFileName))
	require.ErrorIs(t, err, os.ErrNotExist, "saved policies in force removed")

	// Cleaning up what is already clean is fine.
	stdout, errOut, code = runAgentCommand(t, "cleanup", "--bpf-root="+bpfRoot, "--state-dir="+stateDir)
	require.Equal(t, agentcmd.ExitOK, code, errOut)
	require.Equal(t, "Nothing pinned under "+bpfRoot+": not a bpffs mount\nNothing of the agent's in "+stateDir+"\n", stdout)
}

// killedAgent runs an agent with args and SIGKILLs it once started: its
// shell socket is left behind, as by an agent that did not stop cleanly.
func killedAgent(t *testing.T, sockPath string, args ...string) {
	t.Helper()
	a := startAgentProcess(t, agentCommand(args...))
	a.waitStarted(t)
	require.NoError(t, a.cmd.Process.Kill())
	a.requireExit(t, -1)
	requireSocket(t, sockPath, "left behind by the killed agent")
}

func requireSocket(t *testing.T, path, why string) {
	t.Helper()
	info, err := os.Lstat(path)
	require.NoError(t, err, "%s: %s", path, why)
	require.Equal(t, os.ModeSocket, info.Mode().Type(), "%s: %s", path, why)
}

// TestPrivilegedCleanupRemovesShellSocket: cleanup removes the socket that
// --shell-sock-path names, and only that one; without the flag, it removes
// <state-dir>/shell.sock, which is the agent's default socket for the
// default state directory. A socket an agent listens on, or a path that is
// not a socket, is left alone (exit 1).
func TestPrivilegedCleanupRemovesShellSocket(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	require.Equal(t, filepath.Join(statedir.DefaultConfig.StateDir, defaultShellSockName), cells.DefaultShellSockPath,
		"without the flag, cleanup removes the agent's default socket of the default state directory")

	t.Run("flag", func(t *testing.T) {
		d := newAgentDirs(t)
		custom := filepath.Join(t.TempDir(), "elsewhere", "agent.sock")
		killedAgent(t, custom, "--state-dir="+d.stateDir, "--bpf-root="+d.bpfRoot, "--shell-sock-path="+custom)
		// A socket where cleanup would look without the flag, which is not
		// the agent's this time.
		decoy, err := net.ListenUnix("unix", &net.UnixAddr{Name: d.sockPath(), Net: "unix"})
		require.NoError(t, err)
		decoy.SetUnlinkOnClose(false)
		decoy.Close()

		_, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+d.bpfRoot, "--state-dir="+d.stateDir,
			"--shell-sock-path="+custom)
		require.Equal(t, agentcmd.ExitOK, code, errOut)
		_, err = os.Lstat(custom)
		require.ErrorIs(t, err, os.ErrNotExist, "the --shell-sock-path socket is removed")
		requireSocket(t, d.sockPath(), "not the one --shell-sock-path names: kept")
	})

	t.Run("default", func(t *testing.T) {
		d := newAgentDirs(t)
		killedAgent(t, d.sockPath(), d.args()...)
		_, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+d.bpfRoot, "--state-dir="+d.stateDir)
		require.Equal(t, agentcmd.ExitOK, code, errOut)
		_, err := os.Lstat(d.sockPath())
		require.ErrorIs(t, err, os.ErrNotExist, "<state-dir>/shell.sock is removed without the flag")
		_, err = os.Stat(filepath.Join(d.stateDir, cells.OwnerLockFileName))
		require.ErrorIs(t, err, os.ErrNotExist, "the rest of the state is removed as before")
	})

	t.Run("listening", func(t *testing.T) {
		running := newAgentDirs(t)
		a := startAgentProcess(t, agentCommand(running.args()...))
		a.waitStarted(t)
		other := newAgentDirs(t)
		require.NoError(t, os.MkdirAll(other.stateDir, 0o700))
		_, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+other.bpfRoot, "--state-dir="+other.stateDir,
			"--shell-sock-path="+running.sockPath())
		require.Equal(t, agentcmd.ExitFailure, code, errOut)
		require.Contains(t, errOut, running.sockPath())
		require.Contains(t, errOut, errShellSocketInUse.Error())
		requireSocket(t, running.sockPath(), "an agent listens on it")
		var out bytes.Buffer
		require.NoError(t, cells.ShellExchange(running.sockPath(), "health", &out), "the agent still serves its shell")
		a.stop(t)
	})

	t.Run("not a socket", func(t *testing.T) {
		d := newAgentDirs(t)
		require.NoError(t, os.MkdirAll(d.stateDir, 0o700))
		file := filepath.Join(t.TempDir(), "precious")
		require.NoError(t, os.WriteFile(file, []byte("keep me\n"), 0o600))
		_, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+d.bpfRoot, "--state-dir="+d.stateDir,
			"--shell-sock-path="+file)
		require.Equal(t, agentcmd.ExitFailure, code, errOut)
		require.Contains(t, errOut, errNotASocket.Error())
		require.FileExists(t, file, "a file that is not a socket is left alone")
	})
}

// TestCleanupStateFilesAreDeclared: cleanup removes the files the cells
// declare, each with its set-aside copy, the identity checkpoint and the
// saved policies in force among them.
func TestCleanupStateFilesAreDeclared(t *testing.T) {
	files, err := declaredStateFiles()
	require.NoError(t, err)
	require.Equal(t, []string{
		cnicell.StateFileName, cnicell.StateFileName + ".corrupt", cnicell.DefaultSockName, cnicell.DefaultSockName + ".corrupt",
		endpointcell.InForceFileName, endpointcell.InForceFileName + ".corrupt",
		fqdn.CheckpointFileName, fqdn.CheckpointFileName + ".corrupt",
		identitycell.CheckpointFileName, identitycell.CheckpointFileName + ".corrupt",
		policycell.InForceFileName, policycell.InForceFileName + ".corrupt",
	}, files)
}

// TestPrivilegedCleanupNotBPFFS: a --bpf-root that is not a bpffs mount
// holds no pins: cleanup says so, removes nothing there (not even what
// looks like the pin directory), still removes the state files, and
// exits 0, nothing of the agent's being left.
func TestPrivilegedCleanupNotBPFFS(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	bpfRoot, stateDir := t.TempDir(), t.TempDir()
	lookalike := filepath.Join(bpfRoot, "ipcache-agent", "ipcache")
	require.NoError(t, os.MkdirAll(filepath.Dir(lookalike), 0o700))
	require.NoError(t, os.WriteFile(lookalike, []byte("not a pin\n"), 0o600))
	checkpoint := filepath.Join(stateDir, identitycell.CheckpointFileName)
	require.NoError(t, os.WriteFile(checkpoint, []byte("{}\n"), 0o600))

	stdout, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+bpfRoot, "--state-dir="+stateDir)
	require.Equal(t, agentcmd.ExitOK, code, errOut)
	require.Equal(t, "Nothing pinned under "+bpfRoot+": not a bpffs mount\n"+
		"Removed state from "+stateDir+": "+identitycell.CheckpointFileName+"\n", stdout)
	require.NotContains(t, stdout, "Removed pins")
	require.FileExists(t, lookalike, "nothing removed under a --bpf-root that is not bpffs")
	require.NoFileExists(t, checkpoint, "the state files are removed all the same")

	require.NoError(t, os.WriteFile(checkpoint, []byte("{}\n"), 0o600))
	stdout, errOut, code = runAgentCommand(t, "cleanup", "--bpf-root="+bpfRoot, "--state-dir="+stateDir, "-o", "json")
	require.Equal(t, agentcmd.ExitOK, code, errOut)
	var report map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &report), stdout)
	require.Equal(t, false, report["bpffs"])
	require.Equal(t, bpfRoot, report["bpfRoot"])
	require.Equal(t, []any{}, report["removedMaps"], "arrays, never null")
	require.Equal(t, []any{identitycell.CheckpointFileName}, report["removedStateFiles"])
}

// TestPrivilegedCleanupLeavesBPFFSNotTheAgents: cleanup unmounts only the
// bpffs the agent mounted, and only when nothing but the agent's pins
// were in it; otherwise the mount stays and the output says why. The
// -o json object says the same as the text.
func TestPrivilegedCleanupLeavesBPFFSNotTheAgents(t *testing.T) {
	t.Parallel()
	privileged.Test(t)

	t.Run("mounted by the test", func(t *testing.T) {
		d := newAgentDirs(t)
		require.NoError(t, privileged.MountBPFFS(t, d.bpfRoot))
		a := startAgentProcess(t, agentCommand(d.args()...))
		a.waitStarted(t)
		a.stop(t)
		require.NoFileExists(t, filepath.Join(d.stateDir, cells.BPFFSMountFileName), "the agent mounted nothing")

		stdout, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+d.bpfRoot, "--state-dir="+d.stateDir, "-o", "json")
		require.Equal(t, agentcmd.ExitOK, code, errOut)
		var report cleanupReport
		require.NoError(t, json.Unmarshal([]byte(stdout), &report), stdout)
		require.True(t, report.BPFFS)
		require.Contains(t, report.RemovedMaps, "ipcache")
		require.False(t, report.UnmountedBPFFS)
		require.Equal(t, []leftBehind{{Path: d.bpfRoot, What: leftMount, Reason: "not mounted by the agent"}}, report.Left)
		require.True(t, mountedAt(t, d.bpfRoot), "a bpffs the agent did not mount stays")
		require.NoDirExists(t, bpfmaps.PinDir(d.bpfRoot))
	})

	t.Run("other pins", func(t *testing.T) {
		d := newAgentDirs(t)
		a := startAgentProcess(t, agentCommand(d.args()...))
		a.waitStarted(t)
		a.stop(t)
		require.FileExists(t, filepath.Join(d.stateDir, cells.BPFFSMountFileName), "the agent mounted bpffs")
		other, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		require.NoError(t, err)
		defer other.Close()
		require.NoError(t, other.Pin(filepath.Join(d.bpfRoot, "someone-elses")))

		stdout, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+d.bpfRoot, "--state-dir="+d.stateDir)
		require.Equal(t, agentcmd.ExitOK, code, errOut)
		require.Contains(t, stdout, "Removed pins: "+bpfmaps.PinDir(d.bpfRoot))
		require.Contains(t, stdout, "Left "+d.bpfRoot+" mounted: mounted by the agent, but it holds pins other than the agent's (someone-elses)\n")
		require.NotContains(t, stdout, "Unmounted")
		require.True(t, mountedAt(t, d.bpfRoot))
		require.FileExists(t, filepath.Join(d.bpfRoot, "someone-elses"))
	})
}
