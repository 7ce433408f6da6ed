// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
)

// ptpConf is a network configuration as libcni hands it to the plugin
// after ptp: the host end of the veth first, without a sandbox.
func ptpConf(sock string) []byte {
	return []byte(`{
  "cniVersion": "1.0.0", "name": "pods", "type": "ipcache-agent-cni",
  "socketPath": "` + sock + `",
  "args": {"cni": {"labels": [{"key": "app", "value": "web"}, {"key": "tier", "value": "front"}], "other": 1}},
  "prevResult": {
    "cniVersion": "1.0.0",
    "interfaces": [
      {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:ff"},
      {"name": "eth0", "mac": "aa:bb:cc:dd:ee:00", "sandbox": "/var/run/netns/c1"}
    ],
    "ips": [
      {"interface": 1, "address": "fd00::5/64"},
      {"interface": 1, "address": "10.1.0.5/24", "gateway": "10.1.0.1"}
    ]
  }
}`)
}

// agent answers each request with answer's error, recording them, and
// Attachments with attachments.
type agent struct {
	mu          sync.Mutex
	requests    []endpointapi.Request
	attachments []endpointapi.Attachment
}

func startAgent(t *testing.T, answer string) (string, *agent) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cni.sock")
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	a := &agent{}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			req, err := endpointapi.ReadRequest(conn)
			require.NoError(t, err)
			a.mu.Lock()
			a.requests = append(a.requests, req)
			resp := endpointapi.Response{Error: answer}
			if req.Command == endpointapi.Attachments {
				resp.Attachments = a.attachments
			}
			a.mu.Unlock()
			endpointapi.WriteResponse(conn, resp)
			conn.Close()
		}
	})
	return path, a
}

func cmdArgs(stdin []byte, cniArgs string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/c1", Args: cniArgs, StdinData: stdin}
}

func TestAddSendsTheEndpoint(t *testing.T) {
	sock, a := startAgent(t, "")
	var p plugin
	require.NoError(t, p.add(cmdArgs(ptpConf(sock), "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=c1")))
	require.Equal(t, []endpointapi.Request{{
		Command: endpointapi.Add, ContainerID: "c1", IfName: "eth0",
		Endpoint: endpoint.Endpoint{
			Namespace: "shop", Name: "web-1",
			Labels:    map[string]string{"app": "web", "tier": "front"},
			Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5")},
			Interface: "veth1234",
		},
		Network: "pods",
	}}, a.requests)
}

func TestNameWithoutPodArgs(t *testing.T) {
	sock, a := startAgent(t, "")
	var p plugin
	require.NoError(t, p.del(cmdArgs(ptpConf(sock), "")))
	require.Equal(t, endpoint.Endpoint{Namespace: "default", Name: "c1"}, a.requests[0].Endpoint)
	require.Equal(t, endpointapi.Del, a.requests[0].Command)
}

func TestBridgeHostInterface(t *testing.T) {
	// bridge lists the bridge, then the veth's host end, then the
	// container's end: the endpoint is behind the veth.
	conf := []byte(`{"cniVersion": "0.4.0", "name": "pods", "type": "ipcache-agent-cni", "socketPath": "SOCK",
  "prevResult": {"cniVersion": "0.4.0",
    "interfaces": [{"name": "cni0"}, {"name": "veth9"}, {"name": "eth0", "sandbox": "/proc/1/ns/net"}],
    "ips": [{"version": "4", "interface": 2, "address": "10.2.0.7/24"}]}}`)
	sock, a := startAgent(t, "")
	conf = []byte(strings.ReplaceAll(string(conf), "SOCK", sock))
	var p plugin
	require.NoError(t, p.add(cmdArgs(conf, "")))
	require.Equal(t, "veth9", a.requests[0].Endpoint.Interface)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("10.2.0.7")}, a.requests[0].Endpoint.Addresses)
}

func TestAddWithoutAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cni.sock")
	var p plugin
	err := p.add(cmdArgs(ptpConf(sock), ""))
	var cniErr *types.Error
	require.ErrorAs(t, err, &cniErr)
	require.Equal(t, uint(types.ErrTryAgainLater), cniErr.Code)
	require.Contains(t, cniErr.Msg, "ipcache-agent is not running: dial unix "+sock+": ")
}

func TestDelWithoutAgentSucceeds(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cni.sock")
	var p plugin
	require.NoError(t, p.del(cmdArgs(ptpConf(sock), "")))
}

func TestAddRejected(t *testing.T) {
	sock, _ := startAgent(t, "address 10.1.0.5 in use by shop/db-1")
	var p plugin
	err := p.add(cmdArgs(ptpConf(sock), ""))
	var cniErr *types.Error
	require.ErrorAs(t, err, &cniErr)
	require.Equal(t, errRejected, cniErr.Code)
	require.Contains(t, cniErr.Msg, "address 10.1.0.5 in use by shop/db-1")
	require.Contains(t, cniErr.Details, "container c1, interface eth0")
}

func TestAddNeedsPrevResult(t *testing.T) {
	var p plugin
	err := p.add(cmdArgs([]byte(`{"cniVersion": "1.0.0", "name": "pods", "type": "ipcache-agent-cni"}`), ""))
	require.ErrorContains(t, err, "must be chained after the plugin that creates the interface")
}

func TestLabelWithoutKey(t *testing.T) {
	sock, a := startAgent(t, "")
	conf := strings.ReplaceAll(string(ptpConf(sock)), `{"key": "app", "value": "web"}`, `{"value": "web"}`)
	var p plugin
	require.ErrorContains(t, p.add(cmdArgs([]byte(conf), "")), `a label without a key (value "web")`)
	require.Empty(t, a.requests)
}

// GC asks the agent for this network's attachments and sends a DEL for
// each one not in cni.dev/valid-attachments, naming its own attachment;
// a GC without the list finds none valid, as the CNI spec's GC and
// cnitool have it.
func TestGCDeletesStaleAttachments(t *testing.T) {
	sock, a := startAgent(t, "")
	a.mu.Lock()
	a.attachments = []endpointapi.Attachment{
		{ContainerID: "c1", IfName: "eth0", Namespace: "shop", Name: "web-1"},
		{ContainerID: "c2", IfName: "eth0", Namespace: "shop", Name: "web-2"},
		{ContainerID: "c1", IfName: "net1", Namespace: "shop", Name: "web-1b"},
	}
	a.mu.Unlock()
	conf := []byte(`{"cniVersion": "1.1.0", "name": "pods", "type": "ipcache-agent-cni", "socketPath": "` + sock + `",
  "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c9", "ifname": "eth0"}]}`)
	var p plugin
	require.NoError(t, p.gc(&skel.CmdArgs{StdinData: conf}))
	del := func(container, ifName, name string) endpointapi.Request {
		return endpointapi.Request{Command: endpointapi.Del, ContainerID: container, IfName: ifName,
			Endpoint: endpoint.Endpoint{Namespace: "shop", Name: name}, Network: "pods"}
	}
	require.Equal(t, []endpointapi.Request{
		{Command: endpointapi.Attachments, Network: "pods"},
		del("c2", "eth0", "web-2"),
		del("c1", "net1", "web-1b"),
	}, a.requests)

	a.mu.Lock()
	a.requests = nil
	a.mu.Unlock()
	conf = []byte(`{"cniVersion": "1.1.0", "name": "pods", "type": "ipcache-agent-cni", "socketPath": "` + sock + `"}`)
	require.NoError(t, p.gc(&skel.CmdArgs{StdinData: conf}))
	require.Len(t, a.requests, 4, "without the list, every attachment of the network is stale")
	require.Equal(t, del("c1", "eth0", "web-1"), a.requests[1])
}

// GC with no agent running has nothing to collect; one the agent refuses
// is a CNI error.
func TestGCWithoutAgentOrRejected(t *testing.T) {
	var p plugin
	conf := func(sock string) []byte {
		return []byte(`{"cniVersion": "1.1.0", "name": "pods", "type": "ipcache-agent-cni", "socketPath": "` + sock + `"}`)
	}
	require.NoError(t, p.gc(&skel.CmdArgs{StdinData: conf(filepath.Join(t.TempDir(), "cni.sock"))}))
	sock, _ := startAgent(t, "bad message")
	err := p.gc(&skel.CmdArgs{StdinData: conf(sock)})
	var cniErr *types.Error
	require.ErrorAs(t, err, &cniErr)
	require.Equal(t, errRejected, cniErr.Code)
	require.Contains(t, cniErr.Details, "CNI ATTACHMENTS of network pods")
}
