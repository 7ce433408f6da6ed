// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/craft"
)

// More of the endpoints through the real binary: spoofed sources and an
// endpoint file that never stops changing.

// spoofPolicy: web (app=web) may send to allowedIP only; no policy picks
// db, so nothing of db's is enforced and a drop of db's traffic is the
// spoofing check's alone.
var spoofPolicy = fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toCIDR: [%s/32]
`, allowedIP)

// endpointDrops is datapath/counters' count of packets dropped in
// direction for reason.
func (e *endpointsE2E) endpointDrops(direction, reason string) uint64 {
	return (&bypassRig{e2e: e.e2e}).drops(direction, reason)
}

// TestPrivilegedEndpointsSpoofedSource: an endpoint bound to its device is
// only itself there. What db sends from its device with web's address is
// dropped as spoofed-source (counted, and shown by the monitor with db's
// device), although db's traffic is enforced nowhere and web may send
// there; with its own address it passes. The kernel alone would deliver
// the spoofed datagram (the control before any agent), so the drop is the
// program's.
func TestPrivilegedEndpointsSpoofedSource(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	// No reverse-path filter in the host's namespace: the kernel would
	// take web's address from db's device.
	for _, conf := range []string{"all", "default", dbDevice} {
		mustRun(t, "ip", "netns", "exec", e.hostNS, "sysctl", "-qw", "net.ipv4.conf."+conf+".rp_filter=0")
	}
	fromDB := craft.OpenSender(t, e.dbNS, "eth0", craft.HardwareAddr(t, e.hostNS, dbDevice))
	atHost := craft.Listen(t, e.hostNS, unix.AF_INET, unix.IPPROTO_UDP)
	spoofed := func(m []byte) error { return fromDB.SendIP(udp(epAddr, allowedIP, 43001, 7000, m)) }
	own := func(m []byte) error { return fromDB.SendIP(udp(dbAddr, allowedIP, 43002, 7000, m)) }
	control := craft.Marker("spoofed before any agent")
	require.NoError(t, spoofed(control))
	require.True(t, atHost.WaitFor(control, deliveredWithin), "without the agent the host takes web's address from db's device")

	e.endpointFile("eps.yaml", endpointDoc("web", "web", epAddr, e2eDevice)+"---\n"+endpointDoc("db", "db", dbAddr, dbDevice))
	e.policyFile("web.yaml", spoofPolicy)
	e.startAgent()
	e.expect(
		pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
		pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, answered),
	)
	db, ok := e.endpoint("default/db")
	require.True(t, ok)
	require.Equal(t, "none", db.Enforcement.Egress, "nothing of db's is enforced")

	drops := e.startMonitor("drop")
	require.Eventually(t, func() bool {
		require.NoError(t, spoofed(craft.Marker("until the monitor shows it")))
		for _, ev := range drops.events() {
			if ev["reason"] == "spoofed-source" && ev["src"] == epAddr && ev["device"] == dbDevice &&
				ev["direction"] == "egress" && ev["verdict"] == "drop" {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the monitor shows the spoofed datagram's drop: %s\nagent: %s", drops.out, e.agentLog)

	for round := range 3 {
		before := e.endpointDrops("egress", "spoofed-source")
		marker := craft.Marker(fmt.Sprintf("spoofed %d", round))
		require.NoError(t, spoofed(marker))
		require.False(t, atHost.WaitFor(marker, notDeliveredWithin), "round %d: web's address from db's device got through", round)
		require.Greater(t, e.endpointDrops("egress", "spoofed-source"), before,
			"round %d: no spoofed-source drop counted; datapath/counters:\n%s", round, e.shell("datapath/counters"))
		ownMarker := craft.Marker(fmt.Sprintf("own %d", round))
		require.NoError(t, own(ownMarker))
		require.True(t, atHost.WaitFor(ownMarker, deliveredWithin), "round %d: db with its own address is delivered", round)
	}
}
