// SPDX-License-Identifier: Apache-2.0

package endpointcell_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// newScriptEngine builds a hive of the identity, ipcache and endpoint
// cells, with test commands that act as endpoint sources. The sources
// named by the #! line's --test-sources are created before start, so
// they hold the `endpoints` table's initialization.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	var (
		registry    endpoint.Registry
		sources     map[string]endpoint.Source
		prestart    []string
		endpoints   *endpointcell.Endpoints
		testFlags   = pflag.NewFlagSet("test", pflag.ContinueOnError)
		testSources = testFlags.StringSlice("test-sources", nil, "sources created before start")
		stateDir    = t.TempDir()
		epDir       = t.TempDir()
		log         = hivetest.Logger(t)
		h           *hive.Hive
		hiveCmds    map[string]script.Cmd
	)
	// build makes a new hive over the same state and endpoint directories:
	// test/restart stops the running one and starts the next, as an agent
	// restart does.
	build := func() {
		sources = map[string]endpoint.Source{}
		h = cells.NewHive(
			identitycell.Cell,
			ipcachecell.Cell,
			endpointcell.Cell,
			cell.Invoke(func(r endpoint.Registry, e *endpointcell.Endpoints) error {
				registry, endpoints = r, e
				for _, owner := range prestart {
					s, err := r.NewSource(owner)
					if err != nil {
						return err
					}
					sources[owner] = s
				}
				return nil
			}),
		)
		flags := pflag.NewFlagSet("", pflag.ContinueOnError)
		h.RegisterFlags(flags)
		flags.AddFlagSet(testFlags)
		require.NoError(t, flags.Set("state-dir", stateDir))
		require.NoError(t, flags.Set("node-name", "node-a"))
		require.NoError(t, flags.Set("endpoint-dir", epDir))
		require.NoError(t, flags.Parse(args))
		prestart = *testSources
		var err error
		hiveCmds, err = h.ScriptCommands(log)
		require.NoError(t, err)
	}
	build()
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	cmds := map[string]script.Cmd{}
	for name := range hiveCmds {
		cmds[name] = proxyCmd{name: name, current: func() map[string]script.Cmd { return hiveCmds }}
	}
	maps.Copy(cmds, script.DefaultCmds())
	maps.Copy(cmds, jsoncmd.Commands())
	cmds["test/restart"] = script.Command(
		script.CmdUsage{Summary: "Stop the hive and start a new one over the same state and endpoint directories"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if err := h.Stop(log, context.Background()); err != nil {
				return nil, err
			}
			build()
			return nil, h.Start(log, context.Background())
		})
	source := func(owner string) (endpoint.Source, error) {
		if s, ok := sources[owner]; ok {
			return s, nil
		}
		s, err := registry.NewSource(owner)
		if err == nil {
			sources[owner] = s
		}
		return s, err
	}
	cmds["test/endpoint"] = script.Command(
		script.CmdUsage{
			Summary: "Upsert an endpoint through a source",
			Args:    "owner namespace/name addr[,addr...] [label=k=v]... [interface=dev] [node=name]",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 3 {
				return nil, script.ErrUsage
			}
			src, err := source(args[0])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			ns, name, _ := strings.Cut(args[1], "/")
			ep := endpoint.Endpoint{Namespace: ns, Name: name, Labels: map[string]string{}}
			for a := range strings.SplitSeq(args[2], ",") {
				addr, err := netip.ParseAddr(a)
				if err != nil {
					return nil, err
				}
				ep.Addresses = append(ep.Addresses, addr)
			}
			for _, arg := range args[3:] {
				key, value, _ := strings.Cut(arg, "=")
				switch key {
				case "label":
					k, v, _ := strings.Cut(value, "=")
					ep.Labels[k] = v
				case "interface":
					ep.Interface = value
				case "node":
					ep.Node = value
				default:
					return nil, fmt.Errorf("unknown argument %q", arg)
				}
			}
			_, err = src.Upsert(ep)
			return scriptcmd.Result("", err)
		})
	cmds["test/endpoint-delete"] = script.Command(
		script.CmdUsage{Summary: "Delete an endpoint through a source", Args: "owner namespace/name"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			src, err := source(args[0])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			return scriptcmd.Result("", src.Delete(args[1]))
		})
	cmds["test/endpoints-initialized"] = script.Command(
		script.CmdUsage{Summary: "Say a source has registered what it had at start", Args: "owner"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 || sources[args[0]] == nil {
				return nil, script.ErrUsage
			}
			sources[args[0]].Initialized()
			return nil, nil
		})
	cmds["test/namespace"] = script.Command(
		script.CmdUsage{Summary: "Set a namespace's labels", Args: "name [k=v]..."},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 1 {
				return nil, script.ErrUsage
			}
			lbls := map[string]string{}
			for _, arg := range args[1:] {
				k, v, _ := strings.Cut(arg, "=")
				lbls[k] = v
			}
			return scriptcmd.Result("", endpoints.SetNamespace(args[0], lbls))
		})
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

// proxyCmd runs the command name of the hive that runs now.
type proxyCmd struct {
	name    string
	current func() map[string]script.Cmd
}

func (p proxyCmd) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	return p.current()[p.name].Run(s, args...)
}

func (p proxyCmd) Usage() *script.CmdUsage { return p.current()[p.name].Usage() }
