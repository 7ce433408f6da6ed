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

// listen opens the transparent UDP and TCP sockets on one port, for
// IPv4 and IPv6 each. With port 0 the first UDP socket picks a free port
// and the others take the same, retried a few times when one of them has
// it in use.
func listen(port uint16, maxUDPSize int) ([]net.PacketConn, []net.Listener, uint16, error) {
	var lastErr error
	for range 5 {
		pcs, lns, got, err := listenOnce(port, maxUDPSize)
		if err == nil {
			return pcs, lns, got, nil
		}
		lastErr = err
		if port != 0 || !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	return nil, nil, 0, fmt.Errorf("%w: %v", ErrListen, lastErr)
}

func listenOnce(port uint16, maxUDPSize int) (pcs []net.PacketConn, lns []net.Listener, got uint16, err error) {
	defer func() {
		if err != nil {
			for _, pc := range pcs {
				pc.Close()
			}
			for _, ln := range lns {
				ln.Close()
			}
		}
	}()
	got = port
	for _, fam := range []struct{ suffix, any string }{{"4", "0.0.0.0"}, {"6", "::"}} {
		v6 := fam.suffix == "6"
		udpCfg := net.ListenConfig{Control: sockopts(v6, true)}
		pc, err := udpCfg.ListenPacket(context.Background(), "udp"+fam.suffix, net.JoinHostPort(fam.any, strconv.Itoa(int(got))))
		if err != nil {
			return pcs, lns, 0, fmt.Errorf("udp%s: %w", fam.suffix, err)
		}
		udp := pc.(*net.UDPConn)
		pcs = append(pcs, &tproxyConn{UDPConn: udp, maxSize: maxUDPSize})
		got = uint16(udp.LocalAddr().(*net.UDPAddr).Port)
		tcpCfg := net.ListenConfig{Control: sockopts(v6, false)}
		ln, err := tcpCfg.Listen(context.Background(), "tcp"+fam.suffix, net.JoinHostPort(fam.any, strconv.Itoa(int(got))))
		if err != nil {
			return pcs, lns, 0, fmt.Errorf("tcp%s: %w", fam.suffix, err)
		}
		lns = append(lns, ln)
	}
	return pcs, lns, got, nil
}

// AnswerMark is the mark (SO_MARK) of the proxy's answers, within the
// mask 0xf00 that the steering mark (0x200) uses too, so that the
// policy route of the steering mark does not match it: the enforcement
// program records the DNS answers that reach an endpoint without it,
// which did not pass through the proxy (datapathcell/bpf/enforce.c).
const AnswerMark = 0xa00

// sockopts makes a listening socket transparent, so that it may accept
// packets and connections addressed to other hosts and (TCP) answer from
// their address; a UDP one also asks for each datagram's original
// destination. Both get AnswerMark, which the connections a TCP one
// accepts inherit (UDP answers go out through sendFrom's sockets), and by
// which the program knows the proxy's sockets from others on its port.
func sockopts(v6, udp bool) func(string, string, syscall.RawConn) error {
	level, transparent, origDst := unix.SOL_IP, unix.IP_TRANSPARENT, unix.IP_RECVORIGDSTADDR
	if v6 {
		level, transparent, origDst = unix.SOL_IPV6, unix.IPV6_TRANSPARENT, unix.IPV6_RECVORIGDSTADDR
	}
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), level, transparent, 1); serr != nil {
				serr = fmt.Errorf("transparent: %w", serr)
				return
			}
			if udp {
				if serr = unix.SetsockoptInt(int(fd), level, origDst, 1); serr != nil {
					serr = fmt.Errorf("original destination: %w", serr)
					return
				}
			}
			// Every socket of the proxy carries its mark: the program
			// assigns the steered queries only to a socket with it.
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, AnswerMark); serr != nil {
				serr = fmt.Errorf("mark: %w", serr)
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
// address with whatever else is bound there). The datagram carries
// AnswerMark.
func sendFrom(src, dst netip.AddrPort, b []byte) error {
	family, level, transparent, freebind := unix.AF_INET, unix.SOL_IP, unix.IP_TRANSPARENT, unix.IP_FREEBIND
	var from, to unix.Sockaddr
	switch {
	case src.Addr().Is4() && dst.Addr().Is4():
		from = &unix.SockaddrInet4{Port: int(src.Port()), Addr: src.Addr().As4()}
		to = &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	case src.Addr().Is6() && dst.Addr().Is6():
		family, level, transparent, freebind = unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, unix.IPV6_FREEBIND
		from = &unix.SockaddrInet6{Port: int(src.Port()), Addr: src.Addr().As16()}
		to = &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
	default:
		return fmt.Errorf("%w: %v to %v: families differ", ErrReply, src, dst)
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReply, err)
	}
	defer unix.Close(fd)
	for _, o := range [][3]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR, 1}, {level, transparent, 1}, {level, freebind, 1},
		{unix.SOL_SOCKET, unix.SO_MARK, AnswerMark}} {
		if err := unix.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
			return fmt.Errorf("%w: setsockopt: %v", ErrReply, err)
		}
	}
	if err := unix.Bind(fd, from); err != nil {
		return fmt.Errorf("%w: bind %v: %v", ErrReply, src, err)
	}
	if err := unix.Sendto(fd, b, 0, to); err != nil {
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

// origDst reads IP_ORIGDSTADDR or IPV6_ORIGDSTADDR from a datagram's
// control messages.
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
		if m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet6 {
			// struct sockaddr_in6: family, port (network order),
			// flow info, address, scope.
			port := binary.BigEndian.Uint16(m.Data[2:4])
			addr := netip.AddrFrom16([16]byte(m.Data[8:24])).Unmap()
			return netip.AddrPortFrom(addr, port)
		}
	}
	return netip.AddrPort{}
}

// limitListener accepts connections while a slot is free (one per open
// connection, shared by the listeners given the same slots); Accept waits
// for one to close beyond that.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, slots chan struct{}) *limitListener {
	return &limitListener{Listener: l, sem: slots, done: make(chan struct{})}
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
