// SPDX-License-Identifier: Apache-2.0

package cnicell_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/cnicell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/registrytest"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// agent is the cell in a hive, over a fake registry, with its socket and
// state directory in a temporary directory.
type agent struct {
	t        *testing.T
	dir      string
	sock     string
	registry *registrytest.Registry
	hive     *hive.Hive
	stop     func()
}

func startAgent(t *testing.T, dir string, reg *registrytest.Registry) *agent {
	t.Helper()
	a := &agent{t: t, dir: dir, sock: filepath.Join(dir, "cni.sock"), registry: reg}
	a.hive = cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return reg }))
	hive.AddConfigOverride(a.hive, func(c *statedir.Config) { c.StateDir = dir })
	hive.AddConfigOverride(a.hive, func(c *cnicell.Config) { c.CNISockPath = a.sock })
	log := hivetest.Logger(t)
	require.NoError(t, a.hive.Start(log, context.Background()))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, a.hive.Stop(log, context.Background()))
		}
	})
	// The cell restores the registered endpoints in its job, after start.
	require.Eventually(t, func() bool { return reg.Initialized(cnicell.Owner) }, 10*time.Second, time.Millisecond)
	a.stop = func() {
		stopped = true
		require.NoError(t, a.hive.Stop(log, context.Background()))
	}
	return a
}

func (a *agent) call(req endpointapi.Request) error {
	return endpointapi.Call(context.Background(), a.sock, req)
}

func webAdd() endpointapi.Request {
	return endpointapi.Request{
		Command: endpointapi.Add, ContainerID: "c1", IfName: "eth0",
		Endpoint: endpoint.Endpoint{
			Namespace: "shop", Name: "web-1",
			Labels:    map[string]string{"app": "web"},
			Addresses: []netip.Addr{netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.1.0.5")},
			Interface: "lo",
		},
	}
}

func with(req endpointapi.Request, cmd endpointapi.Command) endpointapi.Request {
	req.Command = cmd
	return req
}

func savedIDs(t *testing.T, dir string) []string {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(dir, cnicell.StateFileName))
	require.NoError(t, err)
	var st struct {
		Endpoints []struct{ Endpoint endpoint.Endpoint }
	}
	require.NoError(t, json.Unmarshal(body, &st))
	ids := []string{}
	for _, r := range st.Endpoints {
		ids = append(ids, r.Endpoint.ID())
	}
	return ids
}

func TestAddWaitsForEnforcement(t *testing.T) {
	reg := registrytest.New()
	reg.EnforceDelay = 300 * time.Millisecond
	a := startAgent(t, t.TempDir(), reg)
	info, err := os.Stat(a.sock)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the socket is root's only")
	require.True(t, reg.Initialized(cnicell.Owner))

	start := time.Now()
	require.NoError(t, a.call(webAdd()))
	require.GreaterOrEqual(t, time.Since(start), reg.EnforceDelay, "ADD answers once the policy is in the kernel")
	want := webAdd().Endpoint
	want.Addresses = endpoint.SortedAddresses(want.Addresses)
	require.Equal(t, map[string]endpoint.Endpoint{"shop/web-1": want}, reg.Endpoints())
	require.Equal(t, []registrytest.Call{
		{Owner: "cni", Method: "Initialized"},
		{Owner: "cni", Method: "Upsert", ID: "shop/web-1"},
		{Owner: "cni", Method: "WaitEnforced", ID: "shop/web-1"},
	}, reg.Calls())
	require.Equal(t, []string{"shop/web-1"}, savedIDs(t, a.dir))

	require.NoError(t, a.call(with(webAdd(), endpointapi.Check)))
}

func TestBadRequestsDisturbNothing(t *testing.T) {
	reg := registrytest.New()
	reg.MaxEndpoints = 2
	db := endpoint.Endpoint{Namespace: "shop", Name: "db-1", Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.5")}}
	reg.Put("directory:db.yaml", db)
	a := startAgent(t, t.TempDir(), reg)

	err := a.call(webAdd())
	require.ErrorIs(t, err, endpointapi.ErrRejected)
	require.ErrorContains(t, err, "CNI ADD of endpoint shop/web-1 (container c1, interface eth0)")
	require.ErrorContains(t, err, "address 10.1.0.5: address in use by another endpoint shop/db-1")

	noAddr := webAdd()
	noAddr.Endpoint.Addresses = nil
	require.ErrorContains(t, a.call(noAddr), "CNI ADD of endpoint shop/web-1 (container c1, interface eth0): no addresses")

	ok := webAdd()
	ok.Endpoint.Addresses = []netip.Addr{netip.MustParseAddr("10.1.0.6")}
	require.NoError(t, a.call(ok))
	tooMany := webAdd()
	tooMany.ContainerID, tooMany.Endpoint.Name = "c2", "web-2"
	tooMany.Endpoint.Addresses = []netip.Addr{netip.MustParseAddr("10.1.0.7")}
	require.ErrorContains(t, a.call(tooMany), "CNI ADD of endpoint shop/web-2 (container c2, interface eth0): endpoint shop/web-2: too many endpoints")

	ok.Endpoint.Addresses = endpoint.SortedAddresses(ok.Endpoint.Addresses)
	require.Equal(t, map[string]endpoint.Endpoint{"shop/db-1": db, "shop/web-1": ok.Endpoint}, reg.Endpoints())
	require.Equal(t, []string{"shop/web-1"}, savedIDs(t, a.dir))

	// Another source's endpoint is not the plugin's to delete.
	require.NoError(t, a.call(endpointapi.Request{Command: endpointapi.Del, ContainerID: "c9", IfName: "eth0", Endpoint: db}))
	require.Contains(t, reg.Endpoints(), "shop/db-1")
}

func TestDelIsIdempotent(t *testing.T) {
	reg := registrytest.New()
	a := startAgent(t, t.TempDir(), reg)
	del := with(webAdd(), endpointapi.Del)
	require.NoError(t, a.call(del), "nothing registered")

	require.NoError(t, a.call(webAdd()))
	// The DEL of a pod's old sandbox, after its new one was added.
	old := del
	old.ContainerID = "c0"
	require.NoError(t, a.call(old))
	require.Contains(t, reg.Endpoints(), "shop/web-1")

	require.NoError(t, a.call(del))
	require.Empty(t, reg.Endpoints())
	require.Empty(t, savedIDs(t, a.dir))
	require.NoError(t, a.call(del), "again")
	require.ErrorIs(t, a.call(with(webAdd(), endpointapi.Check)), endpointapi.ErrRejected)
}

func TestCheck(t *testing.T) {
	reg := registrytest.New()
	a := startAgent(t, t.TempDir(), reg)
	check := with(webAdd(), endpointapi.Check)
	require.ErrorContains(t, a.call(check), "endpoint not registered by the CNI plugin")

	require.NoError(t, a.call(webAdd()))
	require.NoError(t, a.call(check))

	other := check
	other.Endpoint.Addresses = other.Endpoint.Addresses[:1]
	require.ErrorContains(t, a.call(other), "endpoint registered differently: addresses [10.1.0.5 fd00::5], not [fd00::5]")
	other = check
	other.Endpoint.Labels = map[string]string{"app": "db"}
	require.ErrorContains(t, a.call(other), "endpoint registered differently: labels")
	other = check
	other.IfName = "net1"
	require.ErrorContains(t, a.call(other), "registered by container c1, interface eth0")
}

func TestRegisteredEndpointsSurviveRestarts(t *testing.T) {
	dir := t.TempDir()
	a := startAgent(t, dir, registrytest.New())
	require.NoError(t, a.call(webAdd()))
	gone := webAdd()
	gone.ContainerID, gone.Endpoint.Name, gone.Endpoint.Interface = "c2", "web-2", "gone0"
	gone.Endpoint.Addresses = []netip.Addr{netip.MustParseAddr("10.1.0.9")}
	require.NoError(t, a.call(gone))
	a.stop()
	_, err := os.Stat(a.sock)
	require.ErrorIs(t, err, os.ErrNotExist, "the socket goes with the agent")

	// The interface of web-2 does not exist: its DEL came while no agent
	// ran (the plugin's DEL succeeds then), and it is dropped.
	reg := registrytest.New()
	b := startAgent(t, dir, reg)
	want := webAdd().Endpoint
	want.Addresses = endpoint.SortedAddresses(want.Addresses)
	require.Equal(t, map[string]endpoint.Endpoint{"shop/web-1": want}, reg.Endpoints())
	require.Equal(t, []registrytest.Call{
		{Owner: "cni", Method: "Upsert", ID: "shop/web-1"},
		{Owner: "cni", Method: "Initialized"},
	}, reg.Calls(), "restored before the source says it is initialized")
	require.Equal(t, []string{"shop/web-1"}, savedIDs(t, dir))
	require.NoError(t, b.call(with(webAdd(), endpointapi.Check)))
}

func TestCorruptStateIsSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, cnicell.StateFileName)
	require.NoError(t, os.WriteFile(path, []byte(`{"version": 1, "endpoints": [`), 0o600))
	reg := registrytest.New()
	a := startAgent(t, dir, reg)
	require.True(t, reg.Initialized(cnicell.Owner))
	aside, err := os.ReadFile(statedir.AsideName(path))
	require.NoError(t, err)
	require.Equal(t, `{"version": 1, "endpoints": [`, string(aside))
	require.NoError(t, a.call(webAdd()))
	require.Equal(t, []string{"shop/web-1"}, savedIDs(t, dir))
}

func TestStateFilesDeclared(t *testing.T) {
	var declared []statedir.File
	h := cells.NewHive(cnicell.Cell,
		cell.Provide(func() endpoint.Registry { return registrytest.New() }),
		cell.Invoke(func(f statedir.Files) { declared = f.Files }))
	require.NoError(t, h.Populate(hivetest.Logger(t)))
	var names []string
	for _, f := range declared {
		names = append(names, f.Name)
	}
	require.ElementsMatch(t, []string{cnicell.StateFileName, "cni.sock"}, names,
		"on the defaults the socket is in the state directory")
}

func TestSocketPathFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "from-env.sock")
	t.Setenv("IPCACHE_AGENT_CNI_SOCK_PATH", sock)
	reg := registrytest.New()
	h := cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return reg }))
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = dir })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	defer func() { require.NoError(t, h.Stop(log, context.Background())) }()
	require.Eventually(t, func() bool { return reg.Initialized(cnicell.Owner) }, 10*time.Second, time.Millisecond)
	require.NoError(t, endpointapi.Call(context.Background(), sock, webAdd()))
}

func TestDefaultSocketIsInTheStateDir(t *testing.T) {
	dir := t.TempDir()
	reg := registrytest.New()
	h := cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return reg }))
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = dir })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	defer func() { require.NoError(t, h.Stop(log, context.Background())) }()
	require.Eventually(t, func() bool { return reg.Initialized(cnicell.Owner) }, 10*time.Second, time.Millisecond)
	require.NoError(t, endpointapi.Call(context.Background(), filepath.Join(dir, cnicell.DefaultSockName), webAdd()))
}

func TestNoStateDirServesNothing(t *testing.T) {
	reg := registrytest.New()
	h := cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return reg }))
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	require.NoError(t, h.Stop(log, context.Background()))
	// No source either: the `endpoints` table does not wait for one.
	_, err := reg.NewSource(cnicell.Owner)
	require.NoError(t, err)
}

func TestSocketOfAnotherAgentIsLeftAlone(t *testing.T) {
	first := startAgent(t, t.TempDir(), registrytest.New())
	h := cells.NewHive(cnicell.Cell, cell.Provide(func() endpoint.Registry { return registrytest.New() }))
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = t.TempDir() })
	hive.AddConfigOverride(h, func(c *cnicell.Config) { c.CNISockPath = first.sock })
	err := h.Start(hivetest.Logger(t), context.Background())
	require.ErrorIs(t, err, cnicell.ErrSocketInUse)
	require.ErrorContains(t, err, "--cni-sock-path "+first.sock)
	require.NoError(t, first.call(webAdd()), "the first agent still serves")
}

// Attachments lists the attachments of the request's network alone, and
// the network outlives a restart with the record; a record without a
// network (a plugin that did not send one) is no network's.
func TestAttachmentsOfANetwork(t *testing.T) {
	dir := t.TempDir()
	a := startAgent(t, dir, registrytest.New())
	add := func(container, name, addr, network string) {
		req := webAdd()
		req.ContainerID, req.Endpoint.Name, req.Network = container, name, network
		req.Endpoint.Addresses = []netip.Addr{netip.MustParseAddr(addr)}
		require.NoError(t, a.call(req))
	}
	add("c2", "web-2", "10.1.0.6", "pods")
	add("c1", "web-1", "10.1.0.5", "pods")
	add("c3", "db-1", "10.1.0.7", "other")
	add("c4", "old-1", "10.1.0.8", "")

	want := []endpointapi.Attachment{
		{ContainerID: "c1", IfName: "eth0", Namespace: "shop", Name: "web-1"},
		{ContainerID: "c2", IfName: "eth0", Namespace: "shop", Name: "web-2"},
	}
	got, err := endpointapi.ListAttachments(context.Background(), a.sock, "pods")
	require.NoError(t, err)
	require.Equal(t, want, got)
	got, err = endpointapi.ListAttachments(context.Background(), a.sock, "none")
	require.NoError(t, err)
	require.Empty(t, got)

	a.stop()
	a = startAgent(t, dir, registrytest.New())
	got, err = endpointapi.ListAttachments(context.Background(), a.sock, "pods")
	require.NoError(t, err)
	require.Equal(t, want, got, "restored with its network")
	got, err = endpointapi.ListAttachments(context.Background(), a.sock, "other")
	require.NoError(t, err)
	require.Equal(t, []endpointapi.Attachment{{ContainerID: "c3", IfName: "eth0", Namespace: "shop", Name: "db-1"}}, got)

	_, err = endpointapi.ListAttachments(context.Background(), a.sock, "")
	require.ErrorIs(t, err, endpointapi.ErrRejected, "a request without a network")
}
