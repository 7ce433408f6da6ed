// SPDX-License-Identifier: Apache-2.0

package ipcachecell_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/ipcachetest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// newScriptEngine builds a hive of the identity and ipcache cells, with
// test commands that act as owners of resource handles.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	var ipcache *ipcachecell.IPCache
	h := cells.NewHive(
		identitycell.Cell,
		ipcachecell.Cell,
		cell.Invoke(func(c *ipcachecell.IPCache) { ipcache = c }),
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
	return &script.Engine{Cmds: cmds}
}
