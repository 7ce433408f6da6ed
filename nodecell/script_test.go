// SPDX-License-Identifier: Apache-2.0

package nodecell_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/agenttest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/nodecell"
)

// TestScript runs the scripts of the Node documents (testdata/nodes-*.txtar)
// with the endpoint cell reading a directory of the test's own, as node
// node-a. The host addresses are the test's network namespace's: the
// scripts name only addresses of the documentation ranges, which no link
// has.
func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		return newEngine(t, endpointcell.Cell)
	}, nil, "testdata/nodes-*.txtar")
}

// TestPrivilegedHostScript runs the scripts of this node's addresses
// (testdata/host-*.txtar) with the process in a network namespace of the
// test's own, where the scripts add and remove addresses with ip(8).
func TestPrivilegedHostScript(t *testing.T) {
	privileged.Test(t)
	ns := fmt.Sprintf("ipca-nodecell-%d", os.Getpid())
	if os.Getenv("IPCACHE_AGENT_TEST_NETNS") == "" {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	if !netnstest.InProcessNetns(t, ns, "IPCACHE_AGENT_TEST_NETNS="+ns) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		return newEngine(t)
	}, []string{"PATH=" + os.Getenv("PATH")}, "testdata/host-*.txtar")
}

// TestPrivilegedRestartScript runs the scripts of restarts
// (testdata/restart-*.txtar): the whole control plane over real pinned
// maps (agenttest), in a network namespace of the test's own.
func TestPrivilegedRestartScript(t *testing.T) {
	privileged.Test(t)
	if !netnstest.InFreshProcessNetns(t, "ipca-noderestart", false) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		return agenttest.NewEngine(t, args, func(extra ...cell.Cell) *hive.Hive {
			return cells.NewHive(append([]cell.Cell{cells.ControlPlane}, extra...)...)
		})
	}, []string{"PATH=" + os.Getenv("PATH")}, "testdata/restart-*.txtar")
}

// newEngine builds a hive of the identity, ipcache and node cells and the
// given ones, as node node-a with an endpoint directory of the test's own,
// with commands that write and remove its files.
func newEngine(t testing.TB, extra ...cell.Cell) *script.Engine {
	var (
		log   = hivetest.Logger(t)
		epDir = t.TempDir()
	)
	h := cells.NewHive(append([]cell.Cell{identitycell.Cell, ipcachecell.Cell, nodecell.Cell}, extra...)...)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Set("state-dir", t.TempDir()))
	if flags.Lookup("endpoint-dir") != nil {
		require.NoError(t, flags.Set("node-name", "node-a"))
		require.NoError(t, flags.Set("endpoint-dir", epDir))
	}
	cmds, err := h.ScriptCommands(log)
	require.NoError(t, err)
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	maps.Copy(cmds, script.DefaultCmds())
	maps.Copy(cmds, jsoncmd.Commands())
	cmds["test/epfile-write"] = script.Command(
		script.CmdUsage{Summary: "Write a file of the script into the endpoint directory", Args: "name file"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			content, err := os.ReadFile(s.Path(args[1]))
			if err != nil {
				return nil, err
			}
			// Written whole and renamed in, so the watcher never reads a
			// half-written file.
			tmp := filepath.Join(epDir, ".tmp-"+args[0])
			if err := os.WriteFile(tmp, content, 0o600); err != nil {
				return nil, err
			}
			return nil, os.Rename(tmp, filepath.Join(epDir, args[0]))
		})
	cmds["test/epfile-remove"] = script.Command(
		script.CmdUsage{Summary: "Remove a file of the endpoint directory", Args: "name"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			return nil, os.Remove(filepath.Join(epDir, args[0]))
		})
	return &script.Engine{Cmds: cmds}
}
