// SPDX-License-Identifier: Apache-2.0

package restorecell_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/agenttest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
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
				cell.Provide(labelIdentityCommands),
			}, extra...)...)
		})
	}, nil, "testdata/*.txtar")
}

// labelIdentityCommands are test commands of a user of label identities
// (the endpoints, later): test/allocate and test/release-identity take and drop
// references of the agent's allocator; test/checkpointed waits until the
// checkpoint lists the given numbers.
func labelIdentityCommands(a *identitycell.Allocator, cfg statedir.Config) hive.ScriptCmdsOut {
	parseNumber := func(s string) (identity.Number, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		return identity.Number(n), err
	}
	return hive.NewScriptCmds(map[string]script.Cmd{
		"test/allocate": script.Command(
			script.CmdUsage{Summary: "Allocate the identity of a label set", Args: "labels [requested]"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) < 1 || len(args) > 2 {
					return nil, script.ErrUsage
				}
				lbls, err := labels.Parse(args[0])
				if err != nil {
					return nil, err
				}
				var requested identity.Number
				if len(args) == 2 {
					if requested, err = parseNumber(args[1]); err != nil {
						return nil, err
					}
				}
				txn := a.WriteTxn()
				defer txn.Abort()
				id, err := a.AllocateTxn(txn, lbls, requested)
				if err == nil {
					txn.Commit()
				}
				return scriptcmd.Result(id.String()+"\n", err)
			}),
		"test/release-identity": script.Command(
			script.CmdUsage{Summary: "Release a reference to an identity", Args: "id"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				id, err := parseNumber(args[0])
				if err != nil {
					return nil, err
				}
				txn := a.WriteTxn()
				defer txn.Abort()
				if _, err = a.ReleaseTxn(txn, id); err == nil {
					txn.Commit()
				}
				return scriptcmd.Result("", err)
			}),
		"test/checkpointed": script.Command(
			script.CmdUsage{Summary: "Wait until the identity checkpoint lists the numbers", Args: "id..."},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				path := filepath.Join(cfg.StateDir, identitycell.CheckpointFileName)
				for {
					checkpoint, err := identitycell.ReadCheckpoint(path)
					if err != nil {
						return nil, err
					}
					missing := ""
					for _, arg := range args {
						id, err := parseNumber(arg)
						if err != nil {
							return nil, err
						}
						if _, found := checkpoint.Labels(id); !found {
							missing = arg
						}
					}
					if missing == "" {
						return nil, nil
					}
					select {
					case <-s.Context().Done():
						return nil, fmt.Errorf("identity %s not checkpointed: %w", missing, s.Context().Err())
					case <-time.After(20 * time.Millisecond):
					}
				}
			}),
	})
}
