package ipcachecell_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"
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
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
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

	cmds, err := h.ScriptCommands(hivetest.Logger(t))
	require.NoError(t, err)
	maps.Copy(cmds, script.DefaultCmds())
	handles := map[string]*ipcachecell.Handle{}
	handle := func(resource, src string) (*ipcachecell.Handle, error) {
		if h, ok := handles[resource]; ok {
			return h, nil
		}
		s, err := source.Parse(src)
		if err != nil {
			return nil, err
		}
		h, err := ipcache.NewHandle(resource, s)
		if err == nil {
			handles[resource] = h
		}
		return h, err
	}
	cmds["test/upsert"] = script.Command(
		script.CmdUsage{
			Summary: "Upsert metadata for prefixes through a resource's handle",
			Args:    "resource source prefix[,prefix...] [labels=l1,l2] [requested=N] [explicit=N]",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 3 {
				return nil, script.ErrUsage
			}
			h, err := handle(args[0], args[1])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			var md ipcachecell.Metadata
			for _, arg := range args[3:] {
				key, value, _ := strings.Cut(arg, "=")
				switch key {
				case "labels":
					md.Labels, err = labels.Parse(value)
				case "requested", "explicit":
					var n uint64
					n, err = strconv.ParseUint(value, 10, 32)
					if key == "requested" {
						md.RequestedIdentity = identitycell.NumericIdentity(n)
					} else {
						md.ExplicitIdentity = identitycell.NumericIdentity(n)
					}
				default:
					err = fmt.Errorf("unknown argument %q", arg)
				}
				if err != nil {
					return nil, err
				}
			}
			var batch []ipcachecell.PrefixUpsert
			for p := range strings.SplitSeq(args[2], ",") {
				prefix, err := netip.ParsePrefix(p)
				if err != nil {
					return nil, err
				}
				batch = append(batch, ipcachecell.PrefixUpsert{Prefix: prefix, Metadata: md})
			}
			return scriptcmd.Result("", h.UpsertBatch(batch))
		})
	cmds["test/remove"] = script.Command(
		script.CmdUsage{Summary: "Remove a resource's metadata for a prefix", Args: "resource prefix"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			h, ok := handles[args[0]]
			if !ok {
				return nil, fmt.Errorf("no handle for %s", args[0])
			}
			prefix, err := netip.ParsePrefix(args[1])
			if err != nil {
				return nil, err
			}
			return nil, h.Remove(prefix)
		})
	cmds["test/release"] = script.Command(
		script.CmdUsage{Summary: "Release a resource's handle", Args: "resource"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			h, ok := handles[args[0]]
			if !ok {
				return nil, fmt.Errorf("no handle for %s", args[0])
			}
			delete(handles, args[0])
			return nil, h.Release()
		})
	return &script.Engine{Cmds: cmds}
}
