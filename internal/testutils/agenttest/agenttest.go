// SPDX-License-Identifier: Apache-2.0

// Package agenttest runs the agent's cells in script tests across restarts:
// each `agent/restart` stops the running hive and starts a new one over the
// same bpffs mount and state directory, as a restarted agent process would.
// The hive's own commands (db/*, health, the cells' commands) always act on
// the current hive.
package agenttest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/ipcachetest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// Agent is the hive that currently runs, and what outlives it.
type Agent struct {
	t         testing.TB
	newHive   func(extra ...cell.Cell) *hive.Hive
	args      []string
	BPFRoot   string
	StateDir  string
	PolicyDir string // --policy-dir, if the hive has the flag

	hive    *hive.Hive
	cmds    map[string]script.Cmd
	ipcache *ipcachecell.IPCache
	running bool
	started bool // the current hive has run: a hive runs once
}

// NewEngine returns a script engine over an agent built by newHive, with
// the #! line's flags (args), on a private bpffs mount and state directory.
// Commands: the hive's, the default script commands, agent/start,
// agent/stop, agent/restart, the ipcache owner commands of ipcachetest, and
// test/bpf-ipcache, test/bpf-ipcache-put, test/bpf-policy, test/policy-write
// and test/policy-remove.
func NewEngine(t testing.TB, args []string, newHive func(extra ...cell.Cell) *hive.Hive) *script.Engine {
	a := &Agent{
		t:         t,
		newHive:   newHive,
		args:      args,
		BPFRoot:   filepath.Join(t.TempDir(), "bpf"),
		StateDir:  t.TempDir(),
		PolicyDir: t.TempDir(),
	}
	t.Cleanup(func() {
		a.stop()
		unix.Unmount(a.BPFRoot, unix.MNT_DETACH)
	})
	// Mounted here, not by the agent: the agent refuses to mount bpffs from
	// a mount namespace of its own, which a script run in a network
	// namespace (netnstest.InProcessNetns, `ip netns exec`) has. A test's
	// pins need not outlive it. Without privilege the agent says why.
	_ = privileged.MountBPFFS(t, a.BPFRoot)
	a.build()

	cmds := script.DefaultCmds()
	// exec's grace for a command's output pipes after it exits is 100 ms
	// by default. The scripts of one test run in parallel in one process:
	// another script's fork holds the pipes until its child execs, which
	// on a loaded CI machine took longer (`ip link del` failed with
	// "WaitDelay expired before I/O complete" after it had succeeded).
	cmds["exec"] = script.Exec(func(cmd *exec.Cmd) error { return cmd.Process.Signal(os.Interrupt) }, 5*time.Second)
	for name := range a.cmds {
		if name == "hive/start" || name == "hive/stop" {
			continue // agent/start and agent/stop, which know about restarts
		}
		cmds[name] = a.proxy(name)
	}
	maps.Copy(cmds, ipcachetest.OwnerCommands(func() *ipcachecell.IPCache { return a.ipcache }))
	cmds["agent/start"] = a.command("Start the agent", func() error { return a.start() })
	cmds["agent/stop"] = a.command("Stop the agent (pinned maps stay)", func() error { return a.stop() })
	cmds["agent/restart"] = a.command("Stop the agent and start a new one over the same pinned maps and state", func() error {
		if err := a.stop(); err != nil {
			return err
		}
		return a.start()
	})
	cmds["test/bpf-ipcache"] = a.bpfIPCacheCmd()
	cmds["test/bpf-ipcache-put"] = a.bpfIPCachePutCmd()
	cmds["test/policy-write"] = a.policyWriteCmd()
	cmds["test/policy-remove"] = a.policyRemoveCmd()
	cmds["test/bpf-policy"] = a.bpfPolicyCmd()
	maps.Copy(cmds, jsoncmd.Commands())
	return &script.Engine{Cmds: cmds}
}

func (a *Agent) build() {
	a.hive = a.newHive(cell.Invoke(func(c *ipcachecell.IPCache) { a.ipcache = c }))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	a.hive.RegisterFlags(flags)
	defaults := []string{"--bpf-root=" + a.BPFRoot, "--state-dir=" + a.StateDir}
	if flags.Lookup("policy-dir") != nil {
		defaults = append(defaults, "--policy-dir="+a.PolicyDir)
	}
	require.NoError(a.t, flags.Parse(append(defaults, a.args...)))
	var err error
	a.cmds, err = a.hive.ScriptCommands(hivetest.Logger(a.t))
	require.NoError(a.t, err)
	a.started = false
}

// start starts the current hive, or a new one if the current one has run.
func (a *Agent) start() error {
	if a.running {
		return fmt.Errorf("agent already running")
	}
	if a.started {
		a.build()
	}
	a.started = true
	if err := a.hive.Start(hivetest.Logger(a.t), context.Background()); err != nil {
		// A failed start leaves the hooks it did start running (database,
		// jobs, reconcilers, watchers) until Stop, as hive.Run does.
		a.hive.Stop(hivetest.Logger(a.t), context.Background())
		return err
	}
	a.running = true
	return nil
}

func (a *Agent) stop() error {
	if !a.running {
		return nil
	}
	a.running = false
	return a.hive.Stop(hivetest.Logger(a.t), context.Background())
}

func (a *Agent) command(summary string, fn func() error) script.Cmd {
	return script.Command(script.CmdUsage{Summary: summary},
		func(*script.State, ...string) (script.WaitFunc, error) { return scriptcmd.Result("", fn()) })
}

// proxy runs the current hive's command of that name.
type proxyCmd struct {
	a    *Agent
	name string
}

func (a *Agent) proxy(name string) script.Cmd { return proxyCmd{a, name} }

func (p proxyCmd) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	cmd, ok := p.a.cmds[p.name]
	if !ok {
		return nil, fmt.Errorf("%s: not in the current hive", p.name)
	}
	return cmd.Run(s, args...)
}

func (p proxyCmd) Usage() *script.CmdUsage { return p.a.cmds[p.name].Usage() }

// dumpIPCache returns the pinned ipcache map as sorted "prefix identity"
// lines.
func (a *Agent) dumpIPCache() (string, error) {
	entries, err := bpfmaps.ReadIPCache(a.BPFRoot)
	var lines []string
	for prefix, id := range entries {
		lines = append(lines, fmt.Sprintf("%s %d\n", prefix, id))
	}
	slices.Sort(lines)
	return strings.Join(lines, ""), err
}

func (a *Agent) bpfIPCacheCmd() script.Cmd {
	return a.waitForDump("ipcache map", "prefix identity", a.dumpIPCache)
}

// waitForDump returns a command that waits until dump returns exactly the
// lines of a file (in any order, white space normalized).
func (a *Agent) waitForDump(what, line string, dump func() (string, error)) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: fmt.Sprintf("Wait until the pinned %s holds exactly the '%s' lines of a file", what, line),
			Args:    "file",
			Flags: func(fs *pflag.FlagSet) {
				fs.Duration("timeout", 10*time.Second, "How long to wait")
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			timeout, _ := s.Flags.GetDuration("timeout")
			data, err := os.ReadFile(s.Path(args[0]))
			if err != nil {
				return nil, err
			}
			var wantLines []string
			for line := range strings.Lines(string(data)) {
				if line = strings.Join(strings.Fields(line), " "); line != "" {
					wantLines = append(wantLines, line+"\n")
				}
			}
			slices.Sort(wantLines)
			want := strings.Join(wantLines, "")
			deadline := time.Now().Add(timeout)
			for {
				got, err := dump()
				if err == nil && got == want {
					return nil, nil
				}
				if time.Now().After(deadline) {
					return scriptcmd.Result("", fmt.Errorf("pinned %s is\n%s(err %v)\nwant\n%s", what, got, err, want))
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
}

func (a *Agent) bpfIPCachePutCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Write an entry into the pinned ipcache map directly", Args: "prefix identity"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			prefix, err := netip.ParsePrefix(args[0])
			if err != nil {
				return nil, err
			}
			var id identity.Number
			if _, err := fmt.Sscan(args[1], &id); err != nil {
				return nil, err
			}
			m, err := ebpf.LoadPinnedMap(filepath.Join(a.BPFRoot, "ipcache-agent", bpfmaps.IPCacheName), nil)
			if err != nil {
				return nil, err
			}
			defer m.Close()
			k, v := bpfmaps.NewIPCacheKey(prefix), bpfmaps.NewIPCacheValue(id)
			return nil, m.Put(&k, &v)
		})
}

// policyWriteCmd copies a file of the script into the policy directory,
// atomically (write beside, rename), as a ConfigMap update would.
func (a *Agent) policyWriteCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Write a policy file into the agent's policy directory", Args: "name file"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			data, err := os.ReadFile(s.Path(args[1]))
			if err != nil {
				return nil, err
			}
			tmp := filepath.Join(a.PolicyDir, ".tmp-"+args[0])
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				return nil, err
			}
			return nil, os.Rename(tmp, filepath.Join(a.PolicyDir, args[0]))
		})
}

func (a *Agent) policyRemoveCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Remove a policy file from the agent's policy directory", Args: "name"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			return nil, os.Remove(filepath.Join(a.PolicyDir, args[0]))
		})
}

// dumpPolicy returns the pinned policy map as sorted
// "identity direction protocol port verdict" lines.
func (a *Agent) dumpPolicy() (string, error) {
	entries, err := bpfmaps.ReadPolicy(a.BPFRoot)
	var lines []string
	for k, verdict := range entries {
		id, dir, proto, port := k.Fields()
		lines = append(lines, fmt.Sprintf("%d %d %d %d %d\n", id, dir, proto, port, verdict))
	}
	slices.Sort(lines)
	return strings.Join(lines, ""), err
}

func (a *Agent) bpfPolicyCmd() script.Cmd {
	return a.waitForDump("policy map", "identity direction protocol port verdict", a.dumpPolicy)
}
