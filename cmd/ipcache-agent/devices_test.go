// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// udpStream sends datagrams from a network namespace to one address
// without pause (one every udpStreamInterval) until stopped. Its socket is
// not connected, so each datagram is routed afresh: the device under it
// may go and come back. It counts the datagrams the kernel took.
type udpStream struct {
	fd   int
	sent atomic.Int64
	quit chan struct{}
	done sync.WaitGroup
}

const udpStreamInterval = 200 * time.Microsecond

func startUDPStream(t *testing.T, ns string, dst netip.AddrPort) *udpStream {
	t.Helper()
	s := &udpStream{quit: make(chan struct{})}
	require.NoError(t, netnstest.InNetns(t, ns, func() (err error) {
		s.fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	}))
	to := &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())}
	s.done.Go(func() {
		for {
			select {
			case <-s.quit:
				return
			default:
			}
			// Fails while the device is gone (no route): the stream
			// goes on.
			if unix.Sendto(s.fd, []byte("udp stream"), 0, to) == nil {
				s.sent.Add(1)
			}
			time.Sleep(udpStreamInterval)
		}
	})
	t.Cleanup(func() { s.stop() })
	return s
}

// stop ends the stream (again: a no-op) and returns the datagrams sent.
func (s *udpStream) stop() int64 {
	select {
	case <-s.quit:
	default:
		close(s.quit)
		s.done.Wait()
		unix.Close(s.fd)
	}
	return s.sent.Load()
}

// udpCounter counts the datagrams that reach a UDP socket.
type udpCounter struct {
	conn     net.PacketConn
	received atomic.Int64
	done     sync.WaitGroup
}

// countUDP listens on addr in the namespace ns until the test ends.
func countUDP(t *testing.T, ns string, addr netip.AddrPort) *udpCounter {
	t.Helper()
	c := &udpCounter{}
	require.NoError(t, netnstest.InNetns(t, ns, func() (err error) {
		c.conn, err = net.ListenPacket("udp4", addr.String())
		return err
	}))
	c.done.Go(func() {
		buf := make([]byte, 1500)
		for {
			if _, _, err := c.conn.ReadFrom(buf); err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			c.received.Add(1)
		}
	})
	t.Cleanup(func() { c.conn.Close(); c.done.Wait() })
	return c
}

// recreateDevice deletes the endpoint's veth (both ends) and creates it
// again under the same name, as a CNI plugin or a script would for a
// restarted workload: created, addressed, the endpoint's end up with its
// route, and the host's end up last.
func (e *e2e) recreateDevice() {
	t := e.t
	t.Helper()
	mustRun(t, "ip", "-n", e.hostNS, "link", "del", e2eDevice)
	time.Sleep(50 * time.Millisecond)
	mustRun(t, "ip", "-n", e.hostNS, "link", "add", e2eDevice, "type", "veth", "peer", "name", "eth0", "netns", e.epNS)
	mustRun(t, "ip", "-n", e.epNS, "addr", "add", epAddr+"/24", "dev", "eth0")
	mustRun(t, "ip", "-n", e.epNS, "link", "set", "eth0", "up")
	mustRun(t, "ip", "-n", e.epNS, "route", "add", "default", "via", hostSideAddr)
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", hostSideAddr+"/24", "dev", e2eDevice)
	mustRun(t, "ip", "-n", e.hostNS, "link", "set", e2eDevice, "up")
}

// TestPrivilegedDeviceRecreatedIsEnforced: the device in --devices is
// deleted and created again under its name, three times, while the
// endpoint sends datagrams without pause both to an address its policy
// allows and to one it denies. Each time the new device carries the
// allowed datagrams again, and not one denied datagram ever arrives
// (without the agent they do: the test can fail); the agent pins one link
// per hook of the device as it is now.
func TestPrivilegedDeviceRecreatedIsEnforced(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	allowedDst := netip.MustParseAddrPort(allowedIP + ":7001")
	deniedDst := netip.MustParseAddrPort(otherIP + ":7001")
	allowedAt := countUDP(t, e.hostNS, allowedDst)
	deniedAt := countUDP(t, e.hostNS, deniedDst)
	control := startUDPStream(t, e.epNS, deniedDst)
	require.Eventually(t, func() bool { return deniedAt.received.Load() > 0 }, 5*time.Second, 10*time.Millisecond,
		"without the agent the denied address gets the datagrams")
	control.stop()

	e.writePolicy(allowedIP)
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)
	time.Sleep(100 * time.Millisecond) // the control's last datagrams
	deniedBefore := deniedAt.received.Load()

	denied := startUDPStream(t, e.epNS, deniedDst)
	allowed := startUDPStream(t, e.epNS, allowedDst)
	const rounds = 3
	counted := &bypassRig{e2e: e}
	for round := range rounds {
		dropped := counted.drops("egress", "no-policy")
		e.recreateDevice()
		from := allowedAt.received.Load()
		require.Eventually(t, func() bool { return allowedAt.received.Load() > from+50 }, 10*time.Second, 10*time.Millisecond,
			"round %d: the new device carries the allowed datagrams; agent log:\n%s", round, e.agentLog)
		// The denied datagrams reach the new device too, where the
		// program drops them.
		require.Eventually(t, func() bool { return counted.drops("egress", "no-policy") > dropped+50 }, 10*time.Second, 10*time.Millisecond,
			"round %d: the new device's program drops the denied datagrams", round)
		require.Equal(t, deniedBefore, deniedAt.received.Load(), "round %d: denied datagrams arrived; agent log:\n%s", round, e.agentLog)
	}
	time.Sleep(200 * time.Millisecond)
	sentDenied, sentAllowed := denied.stop(), allowed.stop()
	time.Sleep(100 * time.Millisecond) // the last datagrams in flight
	t.Logf("across %d recreations: %d denied datagrams sent, %d dropped by the program, %d arrived; %d allowed sent, %d arrived",
		rounds, sentDenied, counted.drops("egress", "no-policy"), deniedAt.received.Load()-deniedBefore, sentAllowed, allowedAt.received.Load())
	require.Equal(t, deniedBefore, deniedAt.received.Load(), "denied datagrams arrived")

	pins, err := os.ReadDir(bpfmaps.LinksDir(e.bpfRoot))
	require.NoError(t, err)
	var names []string
	for _, p := range pins {
		names = append(names, p.Name())
	}
	require.Equal(t, []string{e2eDevice + "-egress", e2eDevice + "-ingress"}, names,
		"one pinned link per hook, of the device as it is now")
	e.expect(pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost))
}
