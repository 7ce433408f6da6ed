// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/agenttest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// testNetnsEnv carries the names of the namespaces a test made to the
// test run again inside one of them (netnstest.InProcessNetns).
const testNetnsEnv = "IPCACHE_AGENT_TEST_NETNS"

// newTestNetns makes a named network namespace, removed when the test
// ends; in the run inside it, it returns the name the parent made.
func newTestNetns(t *testing.T, what string) string {
	t.Helper()
	if ns := os.Getenv(testNetnsEnv + "_" + strings.ToUpper(what)); ns != "" {
		return ns
	}
	ns := fmt.Sprintf("ipca-%s-%d", what, os.Getpid())
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, "ip netns add %s: %s", ns, out)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return ns
}

// TestPrivilegedDevicesScript runs the scripts of devices that come and
// go (testdata/devices/*.txtar): the whole control plane with the devices
// cell, and an `endpoints` table that test/endpoint-put writes, in a
// network namespace of the test's own where the scripts make and delete
// devices with ip(8). The scripts run in parallel in that one namespace:
// each has devices of its own names.
func TestPrivilegedDevicesScript(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	ns := newTestNetns(t, "devices")
	if !netnstest.InProcessNetns(t, ns, testNetnsEnv+"_DEVICES="+ns) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		return agenttest.NewEngine(t, args, func(extra ...cell.Cell) *hive.Hive {
			return cells.NewHive(append([]cell.Cell{cells.ControlPlane, devicesTestCell}, extra...)...)
		})
	}, []string{"PATH=" + os.Getenv("PATH")}, "testdata/devices/*.txtar")
}

// devicesTestCell provides the scripts' commands; endpoints are
// registered through the endpoint cell's registry.
var devicesTestCell = cell.Module(
	"test-endpoints",
	"Commands for the device scripts",

	cell.Provide(
		func(registry endpoint.Registry, cfg datapathcell.Config) hive.ScriptCmdsOut {
			return hive.NewScriptCmds(map[string]script.Cmd{
				"test/endpoint-put": endpointPutCmd(registry),
				"test/tcx-attached": tcxAttachedCmd(),
				"test/pinned-links": pinnedLinksCmd(cfg.BPFRoot),
			})
		}),
)

// endpointPutCmd registers a local endpoint behind a device, each with an
// address of its own.
func endpointPutCmd(registry endpoint.Registry) script.Cmd {
	var (
		source endpoint.Source
		next   = netip.MustParseAddr("10.99.0.1")
	)
	return script.Command(
		script.CmdUsage{Summary: "Register a local endpoint behind a device", Args: "name device"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			if source == nil {
				var err error
				if source, err = registry.NewSource("test"); err != nil {
					return nil, err
				}
			}
			addr := next
			next = next.Next()
			_, err := source.Upsert(endpoint.Endpoint{Namespace: "default", Name: args[0], Interface: args[1],
				Labels: map[string]string{"app": args[0]}, Addresses: []netip.Addr{addr}})
			return nil, err
		})
}

// tcxPrograms counts the TCX programs on both hooks of a device of the
// calling thread's namespace.
func tcxPrograms(device string) (int, error) {
	iface, err := net.InterfaceByName(device)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, attach := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: attach})
		if err != nil {
			return 0, err
		}
		n += len(res.Programs)
	}
	return n, nil
}

// tcxAttachedCmd waits until a device has exactly n TCX programs.
func tcxAttachedCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Wait until a device has exactly n TCX programs (both hooks)", Args: "device n"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			want, err := strconv.Atoi(args[1])
			if err != nil {
				return nil, err
			}
			return nil, waitFor(s.Context(), func() (bool, string) {
				n, err := tcxPrograms(args[0])
				return err == nil && n == want, fmt.Sprintf("%s has %d TCX programs (%v), want %d", args[0], n, err, want)
			})
		})
}

// pinnedLinksCmd waits until the pinned links are exactly the given ones.
func pinnedLinksCmd(bpfRoot string) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Wait until the agent's pinned links are exactly the given names", Args: "[name...]"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			want := slices.Sorted(slices.Values(args))
			return nil, waitFor(s.Context(), func() (bool, string) {
				var got []string
				entries, _ := os.ReadDir(bpfmaps.LinksDir(bpfRoot))
				for _, e := range entries {
					got = append(got, e.Name())
				}
				return slices.Equal(got, want), fmt.Sprintf("pinned links %v, want %v", got, want)
			})
		})
}

// waitFor polls cond until it holds, for up to 10 seconds.
func waitFor(ctx context.Context, cond func() (bool, string)) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s", state)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", state, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
