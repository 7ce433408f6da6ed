// SPDX-License-Identifier: Apache-2.0

package restorecell_test

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/agenttest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
)

// TestPrivilegedScript runs the restore scenarios over real pinned maps in
// a private bpffs mount, restarting the agent (stop, new hive, start) inside
// the scripts.
func TestPrivilegedScript(t *testing.T) {
	privileged.Test(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		return agenttest.NewEngine(t, args, func(extra ...cell.Cell) *hive.Hive {
			return cells.NewHive(append([]cell.Cell{
				identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell, restorecell.Cell,
			}, extra...)...)
		})
	}, nil, "testdata/*.txtar")
}
