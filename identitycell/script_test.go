// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"context"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// newScriptEngine builds a hive of the identity cell and what it runs on,
// with the #! line's flags, and test commands that drive the allocator.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	var (
		allocator    *Allocator
		checkpointer *Checkpointer
	)
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(cell.NewSimpleHealth),
		cell.Config(statedir.DefaultConfig),
		Cell,
		cell.Invoke(func(a *Allocator, c *Checkpointer) { allocator, checkpointer = a, c }),
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
	cmds["identity/allocate"] = script.Command(
		script.CmdUsage{Summary: "Allocate an identity", Args: "labels [requested]"},
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
			id, err := allocator.allocate(lbls, identity.Number(requested))
			return scriptcmd.Result(id.String()+"\n", err)
		})
	cmds["identity/release"] = script.Command(
		script.CmdUsage{Summary: "Release a reference to an identity", Args: "id"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			id, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil {
				return nil, err
			}
			_, err = allocator.release(identity.Number(id))
			return nil, err
		})
	cmds["identity/withhold"] = script.Command(
		script.CmdUsage{Summary: "Withhold identity numbers", Args: "id..."},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			for _, arg := range args {
				id, err := strconv.ParseUint(arg, 10, 32)
				if err != nil {
					return nil, err
				}
				if err := allocator.Withhold(identity.Number(id)); err != nil {
					return nil, err
				}
			}
			return nil, nil
		})
	cmds["identity/checkpoint"] = script.Command(
		script.CmdUsage{
			Summary: "Wait until the checkpoint file lists exactly the given 'id labels' lines of a file",
			Args:    "file",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			want, err := os.ReadFile(s.Path(args[0]))
			if err != nil {
				return nil, err
			}
			var got string
			for s.Context().Err() == nil {
				checkpoint, err := ReadCheckpoint(checkpointer.path)
				if err != nil {
					return nil, err
				}
				var lines []string
				for id, lbls := range checkpoint.All() {
					lines = append(lines, fmt.Sprintf("%d %s\n", id, lbls))
				}
				if got = strings.Join(lines, ""); got == string(want) {
					return nil, nil
				}
				time.Sleep(10 * time.Millisecond)
			}
			return nil, fmt.Errorf("checkpoint is\n%s\nwant\n%s", got, want)
		})
	return &script.Engine{Cmds: cmds}
}
