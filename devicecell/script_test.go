// SPDX-License-Identifier: Apache-2.0

package devicecell_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/devicecell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// TestPrivilegedScript runs the scripts (testdata/*.txtar) with the
// devices cell following a network namespace of the test's own, where
// the scripts create and delete devices with ip(8).
func TestPrivilegedScript(t *testing.T) {
	privileged.Test(t)
	ns := fmt.Sprintf("ipca-devcell-%d", os.Getpid())
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
		h := cells.NewHive(devicecell.Cell)
		cmds, err := h.ScriptCommands(hivetest.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		for name, cmd := range script.DefaultCmds() {
			cmds[name] = cmd
		}
		t.Cleanup(func() { h.Stop(hivetest.Logger(t), context.Background()) })
		return &script.Engine{Cmds: cmds}
	}, []string{"PATH=" + os.Getenv("PATH")}, "testdata/*.txtar")
}
