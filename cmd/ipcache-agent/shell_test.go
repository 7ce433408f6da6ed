// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// TestPrivilegedShellErrorsOnceAndPiped: a failing shell command prints
// nothing on stdout and its error once on stderr, with the command's usage
// for a usage error; commands piped into `shell` run without a terminal,
// each error once on stderr, exit 1 if one failed.
func TestPrivilegedShellErrorsOnceAndPiped(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	agent := startAgentProcess(t, agentCommand(dirs.args()...))
	agent.waitStarted(t)
	sock := "--shell-sock-path=" + dirs.sockPath()
	require.Eventually(t, func() bool {
		_, _, code := runAgentCommand(t, "shell", sock, "db/initialized")
		return code == agentcmd.ExitOK
	}, 30*time.Second, 50*time.Millisecond, "tables initialized")

	stdout, stderr, code := runAgentCommand(t, "shell", sock, "identity/show", "300")
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Empty(t, stdout, "an error is not output")
	require.Equal(t, "ipcache-agent: identity/show 300: identity 300 is not allocated\n", stderr)

	stdout, stderr, code = runAgentCommand(t, "shell", sock, "identity/show", "1", "2")
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "identity/show 1 2: invalid usage\nusage: identity/show [-o] [--output=string] identity\n")
	require.Contains(t, stderr, "Output format: text or json")
	require.Equal(t, 1, strings.Count(stderr, "invalid usage"), stderr)

	stdout, stderr, code = runAgentCommand(t, "shell", sock, "health", "--nosuch")
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "health --nosuch: unknown flag: --nosuch\nusage: health ")

	piped := func(commands string) (string, string, int) {
		cmd := agentCommand("shell", sock)
		cmd.Stdin = strings.NewReader(commands)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if exitErr, ok := err.(*exec.ExitError); ok {
			return out.String(), errOut.String(), exitErr.ExitCode()
		}
		require.NoError(t, err)
		return out.String(), errOut.String(), 0
	}
	stdout, stderr, code = piped("identity/get 2\n\n# a comment\ndb/show identities\n")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Empty(t, stderr)
	require.Regexp(t, `Labels: +reserved:world`, stdout)
	require.Contains(t, stdout, "ID ")
	stdout, stderr, code = piped("identity/show 300\nidentity/get 2\n")
	require.Equal(t, agentcmd.ExitFailure, code, stderr)
	require.Regexp(t, `Labels: +reserved:world`, stdout, "the commands after a failed one run")
	require.NotContains(t, stdout, "not allocated")
	require.Equal(t, "identity/show 300: identity 300 is not allocated\nipcache-agent: shell commands failed: 1 of 2\n", stderr)
}

// TestShellHelpListsCommands: `shell --help` lists the commands of the
// agent's shell with their summaries, from the agent's cells, without an
// agent (TestPrivilegedShellCommandsJSONAndErrors checks the list is the
// running agent's), and none the shell does not serve.
func TestShellHelpListsCommands(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runAgentCommand(t, "shell", "--help")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	require.Contains(t, stdout, "--shell-sock-path", "cobra's help comes first")
	require.Contains(t, stdout, "Commands of the agent's shell")
	require.Regexp(t, `(?m)^  policy/explain +Explain the verdict for traffic with an address$`, stdout)
	require.Regexp(t, `(?m)^  datapath/ipcache-status +Count the ipcache entries`, stdout)
	require.Regexp(t, `(?m)^  db/show +Show the contents of a table$`, stdout)
	require.Regexp(t, `(?m)^  help +`, stdout)
	for _, unserved := range []string{"db/insert", "db/delete", "exec", "hive/start", "hive/stop", "hive"} {
		require.NotRegexp(t, `(?m)^  `+unserved+` `, stdout)
	}
}
