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

// agent answers each request with answer's error, recording them.
type agent struct {
	mu       sync.Mutex
	requests []endpointapi.Request
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
			a.mu.Unlock()
			endpointapi.WriteResponse(conn, endpointapi.Response{Error: answer})
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
