// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/craft"
)

// TestPrivilegedEndpointsArbitrarySourceDropped: an endpoint's device
// carries that endpoint's traffic only. What web sends from its device
// with an address of no endpoint (one of its link's subnet, one the host
// routes nowhere) is dropped as spoofed-source, to an address web may
// reach and to one it may not; otherwise it would be the host-wide
// default's, which nothing enforces, and web would reach what its policy
// denies. The kernel alone delivers such datagrams (the control before any
// agent); with its own address web reaches the allowed address.
func TestPrivilegedEndpointsArbitrarySourceDropped(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	for _, conf := range []string{"all", "default", e2eDevice} {
		mustRun(t, "ip", "netns", "exec", e.hostNS, "sysctl", "-qw", "net.ipv4.conf."+conf+".rp_filter=0")
	}
	fromWeb := craft.OpenSender(t, e.epNS, "eth0", craft.HardwareAddr(t, e.hostNS, e2eDevice))
	atHost := craft.Listen(t, e.hostNS, unix.AF_INET, unix.IPPROTO_UDP)
	sources := []string{"10.201.0.77", "10.77.7.7"}
	for _, src := range sources {
		control := craft.Marker("before any agent from " + src)
		require.NoError(t, fromWeb.SendIP(udp(src, otherIP, 44001, 7000, control)))
		require.True(t, atHost.WaitFor(control, deliveredWithin), "without the agent the host takes %s from web's device", src)
	}

	e.endpointFile("eps.yaml", endpointDoc("web", "web", epAddr, e2eDevice)+"---\n"+endpointDoc("db", "db", dbAddr, dbDevice))
	e.policyFile("web.yaml", spoofPolicy)
	e.startAgent()
	e.expect(pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost))

	for _, src := range sources {
		for _, dst := range []string{otherIP, allowedIP} {
			before := e.endpointDrops("egress", "spoofed-source")
			marker := craft.Marker(fmt.Sprintf("from %s to %s", src, dst))
			if err := fromWeb.SendIP(udp(src, dst, 44002, 7000, marker)); err != nil {
				require.ErrorIs(t, err, craft.ErrDroppedOnTransmit)
			}
			require.False(t, atHost.WaitFor(marker, notDeliveredWithin), "%s -> %s from web's device got through", src, dst)
			require.Greater(t, e.endpointDrops("egress", "spoofed-source"), before,
				"%s -> %s: no spoofed-source drop counted; datapath/counters:\n%s", src, dst, e.shell("datapath/counters"))
		}
	}
	own := craft.Marker("web's own address")
	require.NoError(t, fromWeb.SendIP(udp(epAddr, allowedIP, 44003, 7000, own)))
	require.True(t, atHost.WaitFor(own, deliveredWithin), "web with its own address reaches the allowed address")
}
