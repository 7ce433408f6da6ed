// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// endpointNetwork is an endpoint behind a veth, as the agent sees one: the
// endpoint namespace holds testEPDevice, the host namespace holds hostDevice
// (the device the program is attached to) with several addresses the
// endpoint can reach. Both namespaces are named (ip netns) and removed when
// the test ends.
type endpointNetwork struct {
	ep, host   string // namespace names
	hostDevice string
	epAddrs    []netip.Prefix
	hostAddrs  []netip.Prefix
}

const (
	testEPDevice   = "ep0"
	testHostDevice = "host0"
)

var netnsSeq atomic.Uint32

// newEndpointNetwork creates the namespaces and the veth. The endpoint has
// 10.200.0.1 and fd00:200::1; the host side has every address in hostAddrs
// (in 10.200.0.0/24 or fd00:200::/64). IPv6 addresses skip duplicate address
// detection so that they are usable at once.
func newEndpointNetwork(t *testing.T, hostAddrs ...string) *endpointNetwork {
	t.Helper()
	n := netnsSeq.Add(1)
	nw := &endpointNetwork{
		ep:         fmt.Sprintf("ipca-ep-%d-%d", os.Getpid(), n),
		host:       fmt.Sprintf("ipca-host-%d-%d", os.Getpid(), n),
		hostDevice: testHostDevice,
		epAddrs:    []netip.Prefix{netip.MustParsePrefix("10.200.0.1/24"), netip.MustParsePrefix("fd00:200::1/64")},
	}
	for _, a := range hostAddrs {
		addr := netip.MustParseAddr(a)
		bits := 24
		if addr.Is6() {
			bits = 64
		}
		nw.hostAddrs = append(nw.hostAddrs, netip.PrefixFrom(addr, bits))
	}
	for _, ns := range []string{nw.ep, nw.host} {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	nw.createVeth(t)
	return nw
}

// createVeth (re)creates the veth pair and its addresses.
func (nw *endpointNetwork) createVeth(t *testing.T) {
	t.Helper()
	ipCmd(t, "-n", nw.host, "link", "add", nw.hostDevice, "type", "veth", "peer", "name", testEPDevice, "netns", nw.ep)
	for _, side := range []struct {
		ns, dev string
		addrs   []netip.Prefix
	}{{nw.ep, testEPDevice, nw.epAddrs}, {nw.host, nw.hostDevice, nw.hostAddrs}} {
		for _, p := range side.addrs {
			args := []string{"-n", side.ns, "addr", "add", p.String(), "dev", side.dev}
			if p.Addr().Is6() {
				args = append(args, "nodad")
			}
			ipCmd(t, args...)
		}
		ipCmd(t, "-n", side.ns, "link", "set", "lo", "up")
		ipCmd(t, "-n", side.ns, "link", "set", side.dev, "up")
	}
	// A fresh link takes a moment before it carries traffic (IPv6 above all);
	// tests must start from a network that works.
	for _, p := range nw.hostAddrs {
		deadline := time.Now().Add(10 * time.Second)
		for !nw.pingOnce(t, p.Addr().String()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not reachable from the endpoint after setup", p.Addr())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// deleteVeth removes the veth pair (both ends).
func (nw *endpointNetwork) deleteVeth(t *testing.T) {
	t.Helper()
	ipCmd(t, "-n", nw.host, "link", "del", nw.hostDevice)
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// ping sends count echo requests from the endpoint to addr, one every
// interval (seconds, as ping takes it), and returns how many were answered.
func (nw *endpointNetwork) ping(t *testing.T, addr string, count int, interval string) int {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "exec", nw.ep,
		"ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", interval, "-W", "1", addr).CombinedOutput()
	return parsePingReceived(t, string(out))
}

// pingOnce reports whether a single echo request to addr is answered
// within a second.
func (nw *endpointNetwork) pingOnce(t *testing.T, addr string) bool {
	t.Helper()
	return nw.ping(t, addr, 1, "1") == 1
}

// parsePingReceived reads "N packets transmitted, M received" from ping's
// summary.
func parsePingReceived(t *testing.T, out string) int {
	t.Helper()
	for line := range strings.SplitSeq(out, "\n") {
		var sent, received int
		if _, err := fmt.Sscanf(line, "%d packets transmitted, %d received", &sent, &received); err == nil {
			return received
		}
	}
	t.Fatalf("no ping summary in output:\n%s", out)
	return 0
}

func inNetns(t *testing.T, ns string, fn func() error) error { return netnstest.InNetns(t, ns, fn) }

// ifindex returns the index of device in the host namespace.
func (nw *endpointNetwork) ifindex(t *testing.T, device string) int {
	t.Helper()
	var index int
	require.NoError(t, inNetns(t, nw.host, func() error {
		iface, err := net.InterfaceByName(device)
		if err == nil {
			index = iface.Index
		}
		return err
	}))
	return index
}

// attachedPrograms counts the TCX programs (both hooks) on device in the
// host namespace.
func (nw *endpointNetwork) attachedPrograms(t *testing.T, device string) int {
	t.Helper()
	index := nw.ifindex(t, device)
	n := 0
	for _, attach := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		// Queried by ifindex, so in the device's namespace.
		require.NoError(t, inNetns(t, nw.host, func() error {
			res, err := link.QueryPrograms(link.QueryOptions{Target: index, Attach: attach})
			if err == nil {
				n += len(res.Programs)
			}
			return err
		}))
	}
	return n
}
