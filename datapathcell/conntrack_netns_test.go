// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"os/exec"
	"testing"
)

// pingFromHost sends one echo request from the host namespace, from source
// address src, to the endpoint's address of the same family, and reports
// whether it was answered within a second.
func (nw *endpointNetwork) pingFromHost(t *testing.T, src string) bool {
	t.Helper()
	dst := nw.epAddrs[0].Addr()
	if netip.MustParseAddr(src).Is6() {
		dst = nw.epAddrs[1].Addr()
	}
	out, _ := exec.Command("ip", "netns", "exec", nw.host,
		"ping", "-n", "-q", "-c", "1", "-W", "1", "-I", src, dst.String()).CombinedOutput()
	return parsePingReceived(t, string(out)) == 1
}

// reachableFromHost pings the endpoint from each host address once and
// returns which answered.
func (nw *endpointNetwork) reachableFromHost(t *testing.T, srcs ...string) map[string]bool {
	t.Helper()
	ipCmd(t, "-n", nw.host, "neigh", "flush", "dev", nw.hostDevice)
	got := map[string]bool{}
	for _, s := range srcs {
		got[s] = nw.pingFromHost(t, s)
	}
	return got
}
