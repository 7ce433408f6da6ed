// SPDX-License-Identifier: Apache-2.0

package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// listen opens the transparent UDP and TCP sockets on one port (IPv4).
// With port 0 the UDP socket picks a free port and the TCP one takes the
// same, retried a few times when TCP has it in use.
func listen(port uint16, maxUDPSize int) (net.PacketConn, net.Listener, uint16, error) {
	udpCfg := net.ListenConfig{Control: sockopts(true)}
	tcpCfg := net.ListenConfig{Control: sockopts(false)}
	var lastErr error
	for range 5 {
		pc, err := udpCfg.ListenPacket(context.Background(), "udp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(int(port))))
		if err != nil {
			return nil, nil, 0, fmt.Errorf("%w: udp: %v", ErrListen, err)
		}
		udp := pc.(*net.UDPConn)
		got := uint16(udp.LocalAddr().(*net.UDPAddr).Port)
		ln, err := tcpCfg.Listen(context.Background(), "tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(int(got))))
		if err == nil {
			return &tproxyConn{UDPConn: udp, maxSize: maxUDPSize}, ln, got, nil
		}
		udp.Close()
		lastErr = err
		if port != 0 || !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	return nil, nil, 0, fmt.Errorf("%w: tcp: %v", ErrListen, lastErr)
}

// sockopts makes a listening socket transparent, so that it may accept
// packets and connections addressed to other hosts and (TCP) answer from
// their address; a UDP one also asks for each datagram's original
// destination.
func sockopts(udp bool) func(string, string, syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1); serr != nil {
				serr = fmt.Errorf("IP_TRANSPARENT: %w", serr)
				return
			}
			if udp {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1); serr != nil {
					serr = fmt.Errorf("IP_RECVORIGDSTADDR: %w", serr)
				}
			}
		})
		return errors.Join(err, serr)
	}
}

// queryAddr is the address a UDP query came from as the DNS server sees
// it: the client, and the server the query was sent to. The handler reads
// both from ResponseWriter.RemoteAddr, and tproxyConn.WriteTo answers
// from the server's address.
type queryAddr struct {
	client netip.AddrPort
	server netip.AddrPort // invalid when the datagram had no original destination
}

func (a *queryAddr) Network() string { return "udp" }
func (a *queryAddr) String() string  { return a.client.String() }

// tproxyConn is the proxy's UDP socket. It is not a *net.UDPConn to the
// DNS server, which therefore reads through origDstReader and writes
// answers through WriteTo.
type tproxyConn struct {
	*net.UDPConn
	maxSize int
}

// WriteTo sends an answer to the client of a queryAddr from the address
// and port its query was sent to.
func (c *tproxyConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	qa, ok := addr.(*queryAddr)
	if !ok {
		return 0, fmt.Errorf("%w: not a query's address: %v", ErrReply, addr)
	}
	if err := sendFrom(qa.server, qa.client, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// sendFrom sends one datagram from src to dst through a socket bound to
// src, which no local address need be: IP_TRANSPARENT allows the bind,
// SO_REUSEADDR lets answers from one server go out at once (and share the
// address with whatever else is bound there).
func sendFrom(src, dst netip.AddrPort, b []byte) error {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return fmt.Errorf("%w: %v to %v: only IPv4", ErrReply, src, dst)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReply, err)
	}
	defer unix.Close(fd)
	for _, o := range [][2]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR}, {unix.SOL_IP, unix.IP_TRANSPARENT}, {unix.SOL_IP, unix.IP_FREEBIND}} {
		if err := unix.SetsockoptInt(fd, o[0], o[1], 1); err != nil {
			return fmt.Errorf("%w: setsockopt: %v", ErrReply, err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(src.Port()), Addr: src.Addr().As4()}); err != nil {
		return fmt.Errorf("%w: bind %v: %v", ErrReply, src, err)
	}
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
		return fmt.Errorf("%w: send to %v: %v", ErrReply, dst, err)
	}
	return nil
}

// origDstReader reads each UDP query with its original destination
// (IP_ORIGDSTADDR) into a queryAddr.
type origDstReader struct {
	maxSize int
}

var _ dns.PacketConnReader = origDstReader{}

func (origDstReader) ReadTCP(net.Conn, time.Duration) ([]byte, error) {
	return nil, errors.New("dnsproxy: the UDP reader reads no TCP")
}

func (origDstReader) ReadUDP(*net.UDPConn, time.Duration) ([]byte, *dns.SessionUDP, error) {
	return nil, nil, errors.New("dnsproxy: the UDP socket is a tproxyConn")
}

// ReadPacketConn returns the next datagram of at most maxSize bytes;
// longer ones are skipped (the DNS server goes on after a short message,
// so one is returned for each: it is counted there as invalid).
func (r origDstReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	c := conn.(*tproxyConn)
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, nil, err
	}
	buf := make([]byte, r.maxSize)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofSockaddrInet6))
	n, oobn, flags, client, err := c.ReadMsgUDPAddrPort(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	qa := &queryAddr{client: netip.AddrPortFrom(client.Addr().Unmap(), client.Port())}
	if flags&unix.MSG_TRUNC != 0 {
		return buf[:0], qa, nil
	}
	qa.server = origDst(oob[:oobn])
	return buf[:n], qa, nil
}

// origDst reads IP_ORIGDSTADDR from a datagram's control messages.
func origDst(oob []byte) netip.AddrPort {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet4 {
			// struct sockaddr_in: family (host order), port (network
			// order), address.
			port := binary.BigEndian.Uint16(m.Data[2:4])
			addr := netip.AddrFrom4([4]byte(m.Data[4:8]))
			return netip.AddrPortFrom(addr, port)
		}
	}
	return netip.AddrPort{}
}

// limitListener accepts at most max connections open at once; Accept
// waits for one to close beyond that.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, max int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, max), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
