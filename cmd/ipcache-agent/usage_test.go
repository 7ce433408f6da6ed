// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
)

// TestUsageErrorsNameTheCommandsHelp walks the whole command tree (cobra's
// own help and completion commands included): an unknown flag given to any
// command exits 2 and points at that command's --help, by its full path,
// not the root's.
func TestUsageErrorsNameTheCommandsHelp(t *testing.T) {
	root := newRootCommand(io.Discard, io.Discard)
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var paths [][]string
	var walk func(cmd *cobra.Command, path []string)
	walk = func(cmd *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range cmd.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(root, nil)
	require.Greater(t, len(paths), 10, "the tree was walked: %v", paths)

	for _, path := range paths {
		want := strings.Join(append([]string{"ipcache-agent"}, path...), " ")
		t.Run(want, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append(append([]string(nil), path...), "--bogus"), &stdout, &stderr)
			require.Equal(t, agentcmd.ExitUsage, code, "stdout %q stderr %q", &stdout, &stderr)
			require.Equal(t, "ipcache-agent: unknown flag: --bogus\nRun '"+want+" --help' for usage.\n", stderr.String())
		})
	}
	// The hint names the command that refused, not the root, also for an
	// error of the command's own (its arguments).
	var stderr bytes.Buffer
	require.Equal(t, agentcmd.ExitUsage, run([]string{"policy", "validate"}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "Run 'ipcache-agent policy validate --help' for usage.\n")
}
