package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

func tcxPrograms(t *testing.T, device string, attach ebpf.AttachType) int {
	t.Helper()
	iface, err := net.InterfaceByName(device)
	require.NoError(t, err)
	result, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: attach})
	require.NoError(t, err)
	return len(result.Programs)
}

// TestCleanupLeavesNothingBehind runs the agent on a veth device, stops it
// (enforcement and maps stay), then runs cleanup: no pinned object, no
// attached program and no state file is left.
func TestCleanupLeavesNothingBehind(t *testing.T) {
	privileged.Test(t)
	const device = "ipcatest0"
	out, err := exec.Command("ip", "link", "add", device, "type", "veth", "peer", "name", device+"p").CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { exec.Command("ip", "link", "del", device).Run() })
	require.NoError(t, exec.Command("ip", "link", "set", device, "up").Run())

	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	stateDir, policyDir := t.TempDir(), t.TempDir()
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "a.yaml"), []byte("name: a\n"), 0o644))

	cmd := agentCommand("--bpf-root="+bpfRoot, "--state-dir="+stateDir, "--devices="+device,
		"--policy-dir="+policyDir, "--shell-sock-path="+filepath.Join(stateDir, "shell.sock"))
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "Started hive") },
		10*time.Second, 10*time.Millisecond, "agent did not start: %s", &stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), stderr.String())

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
	_, err = os.Stat(pins)
	require.ErrorIs(t, err, os.ErrNotExist, "no pinned object left")
	require.Zero(t, tcxPrograms(t, device, ebpf.AttachTCXIngress), "program detached")
	require.Zero(t, tcxPrograms(t, device, ebpf.AttachTCXEgress))
	_, err = os.Stat(filepath.Join(stateDir, "local-identities.json"))
	require.ErrorIs(t, err, os.ErrNotExist, "checkpoint removed")
	_, err = os.Stat(filepath.Join(stateDir, policycell.InForceFileName))
	require.ErrorIs(t, err, os.ErrNotExist, "saved policies in force removed")

	// Cleaning up what is already clean is fine.
	_, errOut, code = runAgentCommand(t, "cleanup", "--bpf-root="+bpfRoot, "--state-dir="+stateDir)
	require.Equal(t, agentcmd.ExitOK, code, errOut)
}
