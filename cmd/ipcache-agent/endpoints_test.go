// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// Endpoints through the real binary: two workloads behind their own
// devices, picked by their labels, each with its own policy, from the
// endpoint directory (docs/CONTRACT.md, "Endpoints").

// The second endpoint ("db") of the endpoint tests, behind its own veth.
const (
	dbDevice   = "ipcad0"
	dbAddr     = "10.201.5.2"
	dbHostSide = "10.201.5.1"
)

// endpointsE2E is e2e with a second endpoint namespace and an endpoint
// directory the agent reads.
type endpointsE2E struct {
	*e2e
	dbNS, endpointDir string
}

func newEndpointsE2E(t *testing.T) *endpointsE2E {
	e := &endpointsE2E{e2e: newE2E(t), endpointDir: t.TempDir()}
	e.dbNS = e.vethNamespace("db", dbDevice, dbHostSide, dbAddr)
	require.Eventually(t, func() bool { return pingsFrom(e.dbNS, allowedIP) }, 10*time.Second, 50*time.Millisecond,
		"db reaches %s before any agent runs", allowedIP)
	e.extraArgs = append(e.extraArgs, "--endpoint-dir="+e.endpointDir, "--node-name=node-a")
	return e
}

func mustRunQuiet(args ...string) { _ = exec.Command(args[0], args[1:]...).Run() }

// endpointFile writes a file of the endpoint directory atomically.
func (e *endpointsE2E) endpointFile(name, content string) {
	e.t.Helper()
	tmp := filepath.Join(e.endpointDir, ".tmp")
	require.NoError(e.t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(e.t, os.Rename(tmp, filepath.Join(e.endpointDir, name)))
}

// endpointDoc is a native Endpoint document.
func endpointDoc(name, app, addr, device string) string {
	return fmt.Sprintf("apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: %s, labels: {app: %s}}\n"+
		"spec: {addresses: [%s], interface: %s}\n", name, app, addr, device)
}

// endpointJSON is what `endpoint get -o json` says of an endpoint.
type endpointJSON struct {
	Identity    uint32 `json:"identity"`
	Local       bool   `json:"local"`
	Enforcement struct {
		Ingress, Egress string
	} `json:"enforcement"`
}

// endpoint returns what the agent says of endpoint id, or false while it
// has none.
func (e *endpointsE2E) endpoint(id string) (endpointJSON, bool) {
	out, err := e.tryShell("endpoint/get", "-o", "json", id)
	var ep endpointJSON
	if err != nil || json.Unmarshal([]byte(out), &ep) != nil {
		return ep, false
	}
	return ep, true
}

// hostPings pings to from the host side's namespace with the source
// address src.
func (e *endpointsE2E) hostPings(src, to string) probe {
	return probe{what: "ping " + src + " -> " + to, want: lost, run: func() string {
		if exec.Command("ip", "netns", "exec", e.hostNS, "ping", "-c1", "-W1", "-I", src, to).Run() == nil {
			return answered
		}
		return lost
	}}
}

func wanting(p probe, want string) probe { p.want = want; return p }

// TestPrivilegedEndpointsPolicyPerEndpoint: two endpoints with different
// labels get different policies, allowed and denied flows each way; a
// label change under a 1 ms ping loses nothing; a restart changes no
// identity and no pinned entry, under a 1 ms ping that loses nothing.
func TestPrivilegedEndpointsPolicyPerEndpoint(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	e.endpointFile("eps.yaml", endpointDoc("web", "web", epAddr, e2eDevice)+"---\n"+endpointDoc("db", "db", dbAddr, dbDevice))
	e.policyFile("web.yaml", fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: default}
spec:
  endpointSelector: {matchExpressions: [{key: app, operator: In, values: [web, web2]}]}
  egress:
  - toCIDR: [%s/32]
`, allowedIP))
	e.policyFile("db.yaml", fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: db, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: db}}
  egress:
  - toCIDR: [%s/32]
  ingress:
  - fromCIDR: [%s/32]
`, otherIP, allowedIP))
	e.startAgent()

	e.expect(
		pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
		pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, lost),
		wanting(e.hostPings(allowedIP, dbAddr), answered), wanting(e.hostPings(otherIP, dbAddr), lost),
		// web has no ingress rules: its ingress is not enforced.
		wanting(e.hostPings(otherIP, epAddr), answered),
	)
	web, ok := e.endpoint("default/web")
	require.True(t, ok)
	db, _ := e.endpoint("default/db")
	require.NotEqual(t, web.Identity, db.Identity)
	require.True(t, web.Identity >= 256 && web.Identity <= 65535, "a label identity: %d", web.Identity)
	require.Equal(t, "enforced", web.Enforcement.Egress)
	require.Equal(t, "none", web.Enforcement.Ingress)
	require.Equal(t, "enforced", db.Enforcement.Ingress)

	// A label change: web's identity changes, both identities allow
	// allowedIP, so no probe is lost; five times over.
	for round := range 5 {
		app := []string{"web2", "web"}[round%2]
		before, _ := e.endpoint("default/web")
		e.pingDuring(fmt.Sprintf("relabel to %s", app), e.epNS, allowedIP, func() {
			e.endpointFile("eps.yaml", endpointDoc("web", app, epAddr, e2eDevice)+"---\n"+endpointDoc("db", "db", dbAddr, dbDevice))
		}, func(map[netip.Prefix]uint32, [2]bool) bool {
			now, ok := e.endpoint("default/web")
			return ok && now.Identity != before.Identity
		})
	}
	e.expect(pingProbe(e.epNS, otherIP, lost), pingProbe(e.dbNS, allowedIP, lost))

	// A restart: the same identities, the same pinned ipcache, nothing
	// lost by a 1 ms ping from an endpoint.
	webBefore, _ := e.endpoint("default/web")
	dbBefore, _ := e.endpoint("default/db")
	ipcacheBefore, _ := e.state()
	pinger := netnstest.StartPinger(t, e.epNS, allowedIP, time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	e.stopAgent()
	time.Sleep(200 * time.Millisecond)
	e.startAgent()
	require.Eventually(t, func() bool {
		now, ok := e.endpoint("default/web")
		return ok && now.Identity == webBefore.Identity
	}, 20*time.Second, 50*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	sent, replies, longest := pinger.Stop()
	require.Equal(t, sent, replies, "probes lost across the restart, at most %d in a row, at %s; log:\n%s", longest, lostAt(pinger), e.agentLog)
	dbAfter, _ := e.endpoint("default/db")
	require.Equal(t, dbBefore.Identity, dbAfter.Identity)
	ipcacheAfter, _ := e.state()
	require.Equal(t, ipcacheBefore, ipcacheAfter, "the pinned ipcache is unchanged by the restart")
	e.expect(pingProbe(e.epNS, otherIP, lost), pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, lost))
}

// TestPrivilegedEndpointsPodAndNetworkPolicy: a Pod as kubectl prints it,
// picked by a NetworkPolicy's podSelector; the other endpoint, which no
// policy selects, is not enforced.
func TestPrivilegedEndpointsPodAndNetworkPolicy(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	e.endpointFile("pods.yaml", fmt.Sprintf(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata:
    name: web-0
    namespace: shop
    labels: {app: web}
    annotations: {ipcache-agent.io/interface: %s}
  spec: {nodeName: node-a, containers: [{name: web, image: nginx}]}
  status: {phase: Running, podIP: %s, podIPs: [{ip: %s}]}
- apiVersion: v1
  kind: Pod
  metadata:
    name: db-0
    namespace: shop
    labels: {app: db}
    annotations: {ipcache-agent.io/interface: %s}
  spec: {nodeName: node-a}
  status: {phase: Running, podIP: %s}
`, e2eDevice, epAddr, epAddr, dbDevice, dbAddr))
	e.policyFile("netpol.yaml", fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-egress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: %s/32}}]
`, allowedIP))
	e.startAgent()
	e.expect(
		pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
		pingProbe(e.dbNS, allowedIP, answered), pingProbe(e.dbNS, otherIP, answered),
	)
	db, ok := e.endpoint("shop/db-0")
	require.True(t, ok)
	require.Equal(t, "none", db.Enforcement.Egress)
}
