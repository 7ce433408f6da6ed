// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// TestIdentityCommands: `identity list` and `identity get N` show the
// running agent's identities over its shell socket, -o json included, and
// exit as the other commands do: 1 for an identity that is not there or no
// agent, 2 for bad arguments.
func TestIdentityCommands(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"identity"}, {"identity", "get", "x"}, {"identity", "get"}, {"identity", "list", "-o", "yaml"}} {
		_, stderr, code := runAgentCommand(t, args...)
		require.Equal(t, agentcmd.ExitUsage, code, "%v: %s", args, stderr)
	}
	noAgent := "--shell-sock-path=" + filepath.Join(t.TempDir(), "none.sock")
	_, stderr, code := runAgentCommand(t, "identity", "list", noAgent)
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Contains(t, stderr, "no agent is listening")

	privileged.Test(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	policyDir := t.TempDir()
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "p.yaml"),
		[]byte("name: p\negress:\n  - toCIDR: [\"10.20.0.0/16\"]\n"), 0o644))
	sock := "--shell-sock-path=" + filepath.Join(stateDir, "shell.sock")
	// In a network namespace without addresses: the host's would have
	// identities too.
	cmd := inFreshNetns(t, agentCommand("--state-dir="+stateDir, "--bpf-root="+bpfRoot, "--policy-dir="+policyDir, sock))
	var agentErr syncbuf.Buffer
	cmd.Stderr = &agentErr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		_ = cmd.Wait()
	})
	waitAgentStarted(t, &agentErr, cmd.Process.Pid)

	// The reserved identities come first (1 to 8), then the allocated one.
	var rows []map[string]any
	require.Eventually(t, func() bool {
		stdout, _, code := runAgentCommand(t, "identity", "list", "-o", "json", sock)
		return code == agentcmd.ExitOK && json.Unmarshal([]byte(stdout), &rows) == nil && len(rows) == 9
	}, 30*time.Second, 50*time.Millisecond, "the reserved identities and one allocated listed")
	require.Equal(t, float64(2), rows[1]["identity"])
	require.Equal(t, "reserved", rows[1]["kind"])
	require.Equal(t, []any{"reserved:world"}, rows[1]["labels"])
	rows = rows[8:]
	require.Equal(t, "local", rows[0]["kind"])
	require.Equal(t, float64(16777217), rows[0]["identity"])
	require.Equal(t, []any{"cidr:10.20.0.0/16"}, rows[0]["labels"])
	require.Equal(t, false, rows[0]["withheld"])
	users := rows[0]["users"].(map[string]any)
	require.Equal(t, []any{"10.20.0.0/16"}, users["prefixes"].(map[string]any)["first"])

	stdout, stderr, code := runAgentCommand(t, "identity", "get", "16777217", sock)
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Regexp(t, `Labels: +cidr:10.20.0.0/16`, stdout)
	require.Regexp(t, `Prefixes: +10.20.0.0/16`, stdout)
	stdout, stderr, code = runAgentCommand(t, "identity", "get", "16777217", "-o", "json", sock)
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	var one map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &one), stdout)
	require.Equal(t, rows[0], one)

	stdout, stderr, code = runAgentCommand(t, "identity", "get", "2", sock)
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Regexp(t, `Kind: +reserved\nLabels: +reserved:world\n`, stdout)
	stdout, stderr, code = runAgentCommand(t, "shell", sock, "identity/show", "2")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Regexp(t, `Identity: +2\nKind: +reserved\nLabels: +reserved:world\n`, stdout)

	_, stderr, code = runAgentCommand(t, "identity", "get", "300", sock)
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Contains(t, stderr, "identity 300 is neither allocated nor withheld")
}
