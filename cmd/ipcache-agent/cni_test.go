// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cnicell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/cnitest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// TestPrivilegedCNIChainWithAgent: the real cnitool runs the chain ptp +
// ipcache-agent-cni against the real agent. ADD with no agent fails and
// registers nothing; with the agent, ADD returns once the endpoint is
// enforced, so a flow its policy denies, attempted without pause from the
// moment ADD returns, never passes while an allowed one does from its
// first packet; DEL removes it, and DEL again succeeds.
func TestPrivilegedCNIChainWithAgent(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	chain := cnitest.New(t, "10.250.8.0/24", cnitest.Config{
		SocketPath: filepath.Join(e.stateDir, cnicell.DefaultSockName),
		HostNS:     e.hostNS,
		Labels:     map[string]string{"app": "cni"},
	})
	const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1"

	out, err := chain.Run("add", podArgs)
	require.Error(t, err, "ADD without an agent")
	require.Contains(t, out, "ipcache-agent is not running")
	_, err = chain.Run("del", podArgs)
	require.NoError(t, err, "DEL without an agent")

	e.policyFile("cni.yaml", fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cni, namespace: shop}
spec:
  endpointSelector: {matchLabels: {app: cni}}
  egress:
  - toCIDR: [%s/32]
`, allowedIP))
	e.startAgent()
	_, registered := (&endpointsE2E{e2e: e}).endpoint("shop/web-1")
	require.False(t, registered, "the failed ADD registered nothing")

	_, err = chain.Run("add", podArgs)
	require.NoError(t, err, "ADD: %s", e.agentLog)
	// One pinger at a time: pingers in one namespace read each other's
	// replies.
	denied := netnstest.StartPinger(t, chain.PodNS, otherIP, time.Millisecond)
	time.Sleep(time.Second)
	sentDenied, answeredDenied, _ := denied.Stop()
	allowed := netnstest.StartPinger(t, chain.PodNS, allowedIP, time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	sentAllowed, answeredAllowed, longest := allowed.Stop()
	t.Logf("after ADD: denied %d sent, %d answered; then allowed %d sent, %d answered", sentDenied, answeredDenied, sentAllowed, answeredAllowed)
	require.Positive(t, sentDenied)
	require.Zero(t, answeredDenied, "a denied flow passed after ADD returned")
	require.Positive(t, sentAllowed)
	require.Equal(t, sentAllowed, answeredAllowed, "allowed probes lost, at most %d in a row", longest)

	ep, ok := (&endpointsE2E{e2e: e}).endpoint("shop/web-1")
	require.True(t, ok)
	require.Equal(t, "enforced", ep.Enforcement.Egress)
	_, err = chain.Run("check", podArgs)
	require.NoError(t, err, "CHECK")

	_, err = chain.Run("del", podArgs)
	require.NoError(t, err, "DEL")
	_, registered = (&endpointsE2E{e2e: e}).endpoint("shop/web-1")
	require.False(t, registered, "DEL removed it")
	_, err = chain.Run("del", podArgs)
	require.NoError(t, err, "DEL again")
}
