// SPDX-License-Identifier: Apache-2.0

package policycell_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/policygen"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// newScriptEngine builds a hive of the identity, ipcache and policy cells
// with --policy-dir and --state-dir in temporary directories (the script's
// $WORK is not known yet), test commands that change files there, and test
// commands that act as another owner of ipcache metadata. test/restart
// replaces the hive with a new one over the same directories, as a
// restarted agent; the hive's commands act on the current one.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	policyDir, stateDir := t.TempDir(), t.TempDir()
	log := hivetest.Logger(t)
	var (
		ipcache  *ipcachecell.IPCache
		h        *hive.Hive
		hiveCmds map[string]script.Cmd
	)
	build := func() {
		h = cells.NewHive(
			identitycell.Cell,
			ipcachecell.Cell,
			policycell.Cell,
			cell.Config(policyMapConfig{PolicyMapMaxEntries: policycell.DefaultPolicyMapMaxEntries}),
			cell.Provide(func(c policyMapConfig) policy.MapCapacity {
				return policy.MapCapacity(c.PolicyMapMaxEntries)
			}),
			cell.Config(fqdnEnforcerConfig{}),
			cell.Provide(func(c fqdnEnforcerConfig) *policy.FQDNEnforcer {
				if !c.TestFQDNEnforcer {
					return nil
				}
				return &policy.FQDNEnforcer{Name: "test"}
			}),
			cell.Invoke(func(c *ipcachecell.IPCache) { ipcache = c }),
			// The `endpoints` table, as the endpoint cell provides it: the
			// scripts write its rows with db/insert and db/delete.
			cell.Provide(endpoint.NewTable, statedb.RWTable[*endpoint.State].ToTable),
		)
		flags := pflag.NewFlagSet("", pflag.ContinueOnError)
		h.RegisterFlags(flags)
		require.NoError(t, flags.Set("state-dir", stateDir))
		require.NoError(t, flags.Set("policy-dir", policyDir))
		require.NoError(t, flags.Parse(args))
		var err error
		hiveCmds, err = h.ScriptCommands(log)
		require.NoError(t, err)
	}
	build()
	// A script that ends without `hive stop` must not leave the hive
	// running (TestMain checks for leaked goroutines); Stop is a no-op on
	// a hive that is not running.
	t.Cleanup(func() { h.Stop(log, context.Background()) })

	cmds := map[string]script.Cmd{}
	for name := range hiveCmds {
		cmds[name] = currentHiveCmd{name: name, cmds: &hiveCmds}
	}
	maps.Copy(cmds, script.DefaultCmds())
	maps.Copy(cmds, jsoncmd.Commands())
	maps.Copy(cmds, policyDirCommands(policyDir))
	maps.Copy(cmds, stateDirCommands(stateDir))
	maps.Copy(cmds, ownerCommands(func() *ipcachecell.IPCache { return ipcache }))
	cmds["test/restart"] = script.Command(
		script.CmdUsage{Summary: "Stop the hive (if it runs) and start a new one over the same policy and state directories"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 0 {
				return nil, script.ErrUsage
			}
			if err := h.Stop(log, context.Background()); err != nil {
				return nil, err
			}
			build()
			return nil, h.Start(log, context.Background())
		})
	return &script.Engine{Cmds: cmds}
}

// policyMapConfig stands in for the datapath's --policy-map-max-entries,
// which the policy cell reads (policy.MapCapacity): the scripts'
// hive has no datapath.
type policyMapConfig struct {
	PolicyMapMaxEntries uint32
}

func (def policyMapConfig) Flags(flags *pflag.FlagSet) {
	flags.Uint32("policy-map-max-entries", def.PolicyMapMaxEntries, "Maximum entries of the policy map")
}

// fqdnEnforcerConfig stands in for the DNS proxy's cell, which provides
// policy.FQDNEnforcer: with --test-fqdn-enforcer (a script's `#!` line),
// the hive enforces toFQDNs and DNS rules.
type fqdnEnforcerConfig struct {
	TestFQDNEnforcer bool
}

func (def fqdnEnforcerConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("test-fqdn-enforcer", def.TestFQDNEnforcer, "Provide a policy.FQDNEnforcer, as the DNS proxy's cell does")
}

// currentHiveCmd runs the command of that name of the current hive.
type currentHiveCmd struct {
	name string
	cmds *map[string]script.Cmd
}

func (c currentHiveCmd) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	return (*c.cmds)[c.name].Run(s, args...)
}

func (c currentHiveCmd) Usage() *script.CmdUsage { return (*c.cmds)[c.name].Usage() }

// stateDirCommands show and change the files of the state directory.
func stateDirCommands(dir string) map[string]script.Cmd {
	return map[string]script.Cmd{
		"test/state-ls": script.Command(
			script.CmdUsage{Summary: "List the files of the state directory"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				entries, err := os.ReadDir(dir)
				var out strings.Builder
				for _, e := range entries {
					fmt.Fprintln(&out, e.Name())
				}
				return scriptcmd.Result(out.String(), err)
			}),
		"test/state-cat": script.Command(
			script.CmdUsage{Summary: "Print a file of the state directory", Args: "name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 || strings.ContainsRune(args[0], '/') {
					return nil, script.ErrUsage
				}
				data, err := os.ReadFile(filepath.Join(dir, args[0]))
				return scriptcmd.Result(string(data), err)
			}),
		"test/state-write": script.Command(
			script.CmdUsage{Summary: "Write a script file into the state directory", Args: "name file"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 || strings.ContainsRune(args[0], '/') {
					return nil, script.ErrUsage
				}
				data, err := os.ReadFile(s.Path(args[1]))
				if err != nil {
					return nil, err
				}
				return nil, os.WriteFile(filepath.Join(dir, args[0]), data, 0o600)
			}),
	}
}

// inPolicyDir resolves a path relative to the policy directory; it must
// stay inside it.
func inPolicyDir(dir, path string) (string, error) {
	full := filepath.Join(dir, path)
	if rel, err := filepath.Rel(dir, full); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s is outside the policy directory", path)
	}
	return full, nil
}

// writePolicyFile writes a file into the policy directory atomically
// (temporary file and rename).
func writePolicyFile(dir, name string, content []byte) error {
	path, err := inPolicyDir(dir, name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	temp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(temp, content, 0o644); err != nil {
		return err
	}
	return os.Rename(temp, path)
}

func policyDirCommands(dir string) map[string]script.Cmd {
	return map[string]script.Cmd{
		"test/policy-write": script.Command(
			script.CmdUsage{
				Summary: "Write a script file into the policy directory, atomically (temporary file and rename)",
				Args:    "path-in-policy-dir file",
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				content, err := os.ReadFile(s.Path(args[1]))
				if err != nil {
					return nil, err
				}
				return nil, writePolicyFile(dir, args[0], content)
			}),
		"test/policy-generate": script.Command(
			script.CmdUsage{
				Summary: "Write a policy of one egress rule of CIDRs times port ranges into the policy directory, atomically (policygen.CIDRsTimesPorts)",
				Args:    "path-in-policy-dir name cidrs ranges",
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 4 {
					return nil, script.ErrUsage
				}
				cidrs, err := strconv.Atoi(args[2])
				if err != nil {
					return nil, err
				}
				ranges, err := strconv.Atoi(args[3])
				if err != nil {
					return nil, err
				}
				return nil, writePolicyFile(dir, args[0], policygen.CIDRsTimesPorts(args[1], cidrs, ranges))
			}),
		"test/policy-truncate": script.Command(
			script.CmdUsage{
				Summary: "Truncate a file of the policy directory to zero bytes in place, as an editor does before it writes the file again",
				Args:    "path-in-policy-dir",
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				path, err := inPolicyDir(dir, args[0])
				if err != nil {
					return nil, err
				}
				return nil, os.Truncate(path, 0)
			}),
		"test/policy-write-in-place": script.Command(
			script.CmdUsage{
				Summary: "Write a script file over a file of the policy directory in place (same inode, not atomic)",
				Args:    "path-in-policy-dir file",
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				content, err := os.ReadFile(s.Path(args[1]))
				if err != nil {
					return nil, err
				}
				path, err := inPolicyDir(dir, args[0])
				if err != nil {
					return nil, err
				}
				return nil, os.WriteFile(path, content, 0o644)
			}),
		"test/policy-remove": script.Command(
			script.CmdUsage{Summary: "Remove a file or directory of the policy directory", Args: "path-in-policy-dir"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				path, err := inPolicyDir(dir, args[0])
				if err != nil {
					return nil, err
				}
				return nil, os.RemoveAll(path)
			}),
		"test/policy-rename": script.Command(
			script.CmdUsage{Summary: "Rename a file of the policy directory", Args: "from to"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				from, err := inPolicyDir(dir, args[0])
				if err != nil {
					return nil, err
				}
				to, err := inPolicyDir(dir, args[1])
				if err != nil {
					return nil, err
				}
				return nil, os.Rename(from, to)
			}),
		"test/policy-symlink": script.Command(
			script.CmdUsage{
				Summary: "Point a symlink in the policy directory at a target, replacing it atomically (as Kubernetes swaps ..data)",
				Args:    "path-in-policy-dir target",
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				path, err := inPolicyDir(dir, args[0])
				if err != nil {
					return nil, err
				}
				temp := filepath.Join(filepath.Dir(path), ".tmp-link-"+filepath.Base(path))
				if err := os.Symlink(args[1], temp); err != nil {
					return nil, err
				}
				return nil, os.Rename(temp, path)
			}),
	}
}

// ownerCommands act as another owner of ipcache metadata (an embedding
// agent, restore): its prefixes get identities the policies may select.
func ownerCommands(ipcache func() *ipcachecell.IPCache) map[string]script.Cmd {
	handles := map[string]*ipcachecell.Handle{}
	return map[string]script.Cmd{
		"test/upsert": script.Command(
			script.CmdUsage{Summary: "Upsert prefixes through a resource's handle, with labels (as the DNS proxy's fqdn labels)",
				Args: "resource source prefix[,prefix...] [label,...]"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 3 && len(args) != 4 {
					return nil, script.ErrUsage
				}
				var md ipcachecell.Metadata
				if len(args) == 4 {
					var err error
					if md.Labels, err = labels.Parse(args[3]); err != nil {
						return nil, err
					}
				}
				h, ok := handles[args[0]]
				if !ok {
					src, err := source.Parse(args[1])
					if err != nil {
						return nil, err
					}
					if h, err = ipcache().NewHandle(args[0], src); err != nil {
						return scriptcmd.Result("", err)
					}
					handles[args[0]] = h
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
			}),
		"test/release": script.Command(
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
			}),
	}
}
