// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/examples/embed/podcell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/agenttest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// TestPrivilegedScript runs the embedding agent's hive (the project's
// control plane plus podcell, as main composes it) over real pinned maps in
// a private bpffs mount, restarting it inside the scripts. Beside the
// agenttest commands, pods/write and pods/remove change the pods file.
// It runs in a network namespace of its own, which has no address: the
// host's addresses (the node cell's) would be in the tables the scripts
// compare.
func TestPrivilegedScript(t *testing.T) {
	privileged.Test(t)
	if !netnstest.InFreshProcessNetns(t, "ipca-embed", false) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		podsFile := filepath.Join(t.TempDir(), "pods")
		// The #! line's flags come last and override these.
		args = append([]string{"--pods-file=" + podsFile, "--pods-file-interval=20ms"}, args...)
		engine := agenttest.NewEngine(t, args, func(extra ...cell.Cell) *hive.Hive {
			return cells.NewHive(append([]cell.Cell{cells.ControlPlane, podcell.Cell}, extra...)...)
		})
		engine.Cmds["pods/write"] = podsWriteCmd(podsFile)
		engine.Cmds["pods/remove"] = script.Command(
			script.CmdUsage{Summary: "Remove the pods file"},
			func(*script.State, ...string) (script.WaitFunc, error) {
				return scriptcmd.Result("", os.Remove(podsFile))
			})
		return engine
	}, nil, "testdata/*.txtar")
}

// podsWriteCmd replaces the pods file with a file of the script,
// atomically (write beside, rename), so that a re-read never sees half a
// file.
func podsWriteCmd(podsFile string) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Replace the pods file with a file of the script", Args: "file"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			data, err := os.ReadFile(s.Path(args[0]))
			if err != nil {
				return nil, err
			}
			tmp := podsFile + ".tmp"
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				return nil, err
			}
			return nil, os.Rename(tmp, podsFile)
		})
}
