// SPDX-License-Identifier: Apache-2.0

package ipcachecell_test

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/ipcachetest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// newScriptEngine builds a hive of the identity and ipcache cells, with
// test commands that act as owners of resource handles.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	var (
		ipcache   *ipcachecell.IPCache
		allocator *identitycell.Allocator
	)
	h := cells.NewHive(
		identitycell.Cell,
		ipcachecell.Cell,
		cell.Invoke(func(c *ipcachecell.IPCache, a *identitycell.Allocator) { ipcache, allocator = c, a }),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Set("state-dir", t.TempDir()))
	require.NoError(t, flags.Parse(args))

	log := hivetest.Logger(t)
	// A script that ends without `hive stop` must not leave the hive
	// running (TestMain checks for leaked goroutines); Stop is a no-op on
	// a hive that is not running.
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	cmds, err := h.ScriptCommands(log)
	require.NoError(t, err)
	maps.Copy(cmds, script.DefaultCmds())
	maps.Copy(cmds, jsoncmd.Commands())
	maps.Copy(cmds, ipcachetest.OwnerCommands(func() *ipcachecell.IPCache { return ipcache }))
	cmds["test/allocate"] = allocateCommand(func() *identitycell.Allocator { return allocator })
	return &script.Engine{Cmds: cmds}
}

// allocateCommand takes a reference to the identity of a label set, as a
// user of label identities other than the ipcache would.
func allocateCommand(allocator func() *identitycell.Allocator) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Allocate the identity of a label set", Args: "labels [requested]"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 1 || len(args) > 2 {
				return nil, script.ErrUsage
			}
			lbls, err := labels.Parse(args[0])
			if err != nil {
				return nil, err
			}
			var requested uint64
			if len(args) == 2 {
				if requested, err = strconv.ParseUint(args[1], 10, 32); err != nil {
					return nil, err
				}
			}
			txn := allocator().WriteTxn()
			defer txn.Abort()
			id, err := allocator().AllocateTxn(txn, lbls, identity.Number(requested))
			if err == nil {
				txn.Commit()
			}
			return scriptcmd.Result(id.String()+"\n", err)
		})
}
