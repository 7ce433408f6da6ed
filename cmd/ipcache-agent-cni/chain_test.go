// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/cnicell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/cnitest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/registrytest"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// TestPrivilegedCNIChain runs the real cnitool over the chain ptp +
// ipcache-agent-cni against a network namespace: ADD with no agent fails
// with a CNI error that says so and registers nothing; with the agent's
// endpoint socket served (the CNI cell over a fake registry whose
// enforcement takes a moment) ADD registers the pod's name, labels,
// address and host-side interface, CHECK passes, traffic flows over the
// ptp link, DEL removes the endpoint and DEL again succeeds.
func TestPrivilegedCNIChain(t *testing.T) {
	privileged.Test(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "cni.sock")
	chain := cnitest.New(t, "10.250.7.0/24", cnitest.Config{
		SocketPath: sock,
		Labels:     map[string]string{"app": "web", "tier": "front"},
	})
	const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1"

	out, err := chain.Run("add", podArgs)
	require.Error(t, err, "ADD with no agent running")
	require.Contains(t, out, `plugin type="ipcache-agent-cni" failed (add)`)
	require.Contains(t, out, "ipcache-agent is not running: dial unix "+sock+": connect: no such file or directory")
	// The runtime takes a failed ADD back with a DEL, which succeeds with
	// no agent and lets ptp remove its veth and address.
	_, err = chain.Run("del", podArgs)
	require.NoError(t, err)

	reg := registrytest.New()
	reg.EnforceDelay = 200 * time.Millisecond
	h := cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return reg }))
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = dir })
	hive.AddConfigOverride(h, func(c *cnicell.Config) { c.CNISockPath = sock })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	require.Eventually(t, func() bool { return reg.Initialized(cnicell.Owner) }, 10*time.Second, time.Millisecond)
	require.Empty(t, reg.Endpoints(), "the ADD without agent registered nothing")

	start := time.Now()
	out, err = chain.Run("add", podArgs)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), reg.EnforceDelay, "ADD returns once the policy is in the kernel")
	// The plugin passes ptp's result on: the pod's address, ptp's veth.
	var result types100.Result
	require.NoError(t, json.Unmarshal([]byte(out), &result), out)
	require.Len(t, result.IPs, 1)
	podAddr, ok := netip.AddrFromSlice(result.IPs[0].Address.IP)
	require.True(t, ok)
	podAddr = podAddr.Unmap()
	require.True(t, netip.MustParsePrefix(chain.Subnet).Contains(podAddr), "%s in %s", podAddr, chain.Subnet)
	require.Len(t, result.Interfaces, 2)

	eps := reg.Endpoints()
	require.Contains(t, eps, "shop/web-1")
	ep := eps["shop/web-1"]
	require.Equal(t, map[string]string{"app": "web", "tier": "front"}, ep.Labels)
	require.Equal(t, []netip.Addr{podAddr}, ep.Addresses)
	require.Equal(t, result.Interfaces[0].Name, ep.Interface)
	require.Empty(t, result.Interfaces[0].Sandbox)
	link, err := exec.Command("ip", "-n", chain.HostNS, "-o", "link", "show", ep.Interface).CombinedOutput()
	require.NoError(t, err, "the endpoint's interface is ptp's host end: %s", link)

	_, err = chain.Run("check", podArgs)
	require.NoError(t, err)

	ping, err := exec.Command("ip", "netns", "exec", chain.PodNS, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.250.7.1").CombinedOutput()
	require.NoError(t, err, "the pod reaches the host end of the ptp link: %s", ping)

	_, err = chain.Run("del", podArgs)
	require.NoError(t, err)
	require.Empty(t, reg.Endpoints())
	_, err = chain.Run("del", podArgs)
	require.NoError(t, err, "DEL again")
	body, err := os.ReadFile(filepath.Join(dir, cnicell.StateFileName))
	require.NoError(t, err)
	require.NotContains(t, string(body), "web-1")
}

// TestPrivilegedCNIGC runs the real cnitool's GC: the endpoints the plugin
// registered for the network whose attachment the runtime no longer
// knows (here: registered without libcni's cache, as after a runtime lost
// its state) are removed from the agent; another network's stay.
func TestPrivilegedCNIGC(t *testing.T) {
	privileged.Test(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "cni.sock")
	chain := cnitest.New(t, "10.250.8.0/24", cnitest.Config{SocketPath: sock})

	reg := registrytest.New()
	h := cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return reg }))
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = dir })
	hive.AddConfigOverride(h, func(c *cnicell.Config) { c.CNISockPath = sock })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	require.Eventually(t, func() bool { return reg.Initialized(cnicell.Owner) }, 10*time.Second, time.Millisecond)

	add := func(container, name, addr, network string) {
		require.NoError(t, endpointapi.Call(context.Background(), sock, endpointapi.Request{
			Command: endpointapi.Add, ContainerID: container, IfName: "eth0", Network: network,
			Endpoint: endpoint.Endpoint{Namespace: "shop", Name: name, Addresses: []netip.Addr{netip.MustParseAddr(addr)}},
		}))
	}
	add("lost", "lost-1", "10.250.8.9", cnitest.Network)
	add("other", "other-1", "10.250.9.9", "other-network")
	require.Len(t, reg.Endpoints(), 2)

	out, err := chain.GC()
	require.NoError(t, err, out)
	require.Equal(t, []string{"shop/other-1"}, slices.Collect(maps.Keys(reg.Endpoints())))
	body, err := os.ReadFile(filepath.Join(dir, cnicell.StateFileName))
	require.NoError(t, err)
	require.NotContains(t, string(body), "lost-1")

	out, err = chain.GC()
	require.NoError(t, err, "GC again: %s", out)
	require.Len(t, reg.Endpoints(), 1)
}
