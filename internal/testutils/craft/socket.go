// SPDX-License-Identifier: Apache-2.0

package craft

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// HardwareAddr is the Ethernet address of the interface ifname in the
// network namespace ns; the test fails if there is none.
func HardwareAddr(t testing.TB, ns, ifname string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := netnstest.InNetns(t, ns, func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		mac = iface.HardwareAddr
		return nil
	})
	if err != nil || len(mac) != 6 {
		t.Fatalf("hardware address of %s in netns %s: %v (%v)", ifname, ns, mac, err)
	}
	return mac
}

// Sender sends whole Ethernet frames out of one interface, through an
// AF_PACKET socket: the frame goes to the device's transmit path as
// written (through its qdisc and TCX egress hook, as any frame the host
// sends), and the sender's IP stack neither routes nor checks it.
type Sender struct {
	fd      int
	ifindex int
	// Link has the interface's own address as Src and, for a veth, its
	// peer's as Dst, when OpenSender was given it.
	Link Link
}

// OpenSender opens a sender on the interface ifname in the network
// namespace ns, whose frames go to dst (the Ethernet address of the
// receiving interface). It is closed when the test ends.
func OpenSender(t testing.TB, ns, ifname string, dst net.HardwareAddr) *Sender {
	t.Helper()
	s := &Sender{fd: -1}
	err := netnstest.InNetns(t, ns, func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		s.ifindex = iface.Index
		s.Link = Link{Src: iface.HardwareAddr, Dst: dst}
		// Protocol 0: the socket receives nothing, it only sends.
		s.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		return unix.Bind(s.fd, &unix.SockaddrLinklayer{Ifindex: iface.Index})
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		t.Fatalf("frame sender on %s in netns %s: %v", ifname, ns, err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

// ErrDroppedOnTransmit: the device's transmit path dropped the frame (its
// TCX egress program or qdisc said drop, NET_XMIT_DROP, which send(2)
// reports as ENOBUFS). For a frame meant to be dropped there, it is no
// failure.
var ErrDroppedOnTransmit = errors.New("frame dropped on the transmit path")

// Send sends one frame (Ethernet header included).
//
// Possible errors: ErrDroppedOnTransmit; the kernel's (the device is down,
// the frame is longer than its MTU).
func (s *Sender) Send(frame []byte) error {
	to := &unix.SockaddrLinklayer{Ifindex: s.ifindex, Halen: 6}
	copy(to.Addr[:], frame[:6])
	err := unix.Sendto(s.fd, frame, 0, to)
	if errors.Is(err, unix.ENOBUFS) {
		err = ErrDroppedOnTransmit
	}
	if err != nil {
		return fmt.Errorf("send frame of %d bytes: %w", len(frame), err)
	}
	return nil
}

// SendIP frames packet for s.Link behind tags and sends it.
func (s *Sender) SendIP(packet []byte, tags ...Tag) error {
	return s.Send(Ethernet(s.Link, packet, tags...))
}

// Listener reads every packet of one IP protocol that the kernel of a
// network namespace delivers locally, through a raw socket: from the IP
// header on for IPv4, from the protocol's header on for IPv6 (raw IPv6
// sockets are not given the IPv6 header). It keeps them all, for the test
// to look for its markers.
type Listener struct {
	fd   int
	quit chan struct{}
	done sync.WaitGroup

	mu      sync.Mutex
	packets [][]byte
}

// Listen opens a listener in the network namespace ns for family
// (unix.AF_INET or unix.AF_INET6) and protocol (unix.IPPROTO_TCP,
// IPPROTO_UDP, IPPROTO_ICMP, IPPROTO_ICMPV6...). It reads until the test
// ends.
func Listen(t testing.TB, ns string, family, protocol int) *Listener {
	t.Helper()
	l := &Listener{fd: -1, quit: make(chan struct{})}
	err := netnstest.InNetns(t, ns, func() (err error) {
		l.fd, err = unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, protocol)
		return err
	})
	if err != nil {
		t.Fatalf("raw socket (family %d, protocol %d) in netns %s: %v", family, protocol, ns, err)
	}
	// A receive timeout lets the reader notice the end.
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(l.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(l.fd)
		t.Fatalf("raw socket timeout: %v", err)
	}
	l.done.Add(1)
	go l.read()
	t.Cleanup(func() {
		close(l.quit)
		l.done.Wait()
		unix.Close(l.fd)
	})
	return l
}

func (l *Listener) read() {
	defer l.done.Done()
	buf := make([]byte, 65536)
	for {
		select {
		case <-l.quit:
			return
		default:
		}
		n, _, err := unix.Recvfrom(l.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		l.mu.Lock()
		l.packets = append(l.packets, bytes.Clone(buf[:n]))
		l.mu.Unlock()
	}
}

// Received reports whether a packet holding marker was read so far.
func (l *Listener) Received(marker []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.packets {
		if bytes.Contains(p, marker) {
			return true
		}
	}
	return false
}

// WaitFor reports whether a packet holding marker is read within timeout.
// A test that expects no such packet waits the whole timeout: give it what
// an allowed packet needs with room to spare (the counterpart's WaitFor
// shows that), no more.
func (l *Listener) WaitFor(marker []byte, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if l.Received(marker) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
