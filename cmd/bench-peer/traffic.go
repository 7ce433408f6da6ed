// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/netnsrun"
)

// The server's ports: echo answers each request byte with one byte (the
// request/response test and the probes), sink reads and counts.
const (
	echoPort = 5001
	sinkPort = 5002
)

// server is the load generator's server side, in the server namespace,
// listening on every address of both families.
type server struct {
	echo, sink net.Listener
	received   atomic.Int64 // bytes read by the sink
	wg         sync.WaitGroup
	mu         sync.Mutex
	conns      []net.Conn
}

// startServer listens in the namespace ns.
//
// Possible errors: the namespace cannot be entered; listen's.
func startServer(ns string) (*server, error) {
	s := &server{}
	err := netnsrun.Do(ns, func() (err error) {
		if s.echo, err = net.Listen("tcp", net.JoinHostPort("::", strconv.Itoa(echoPort))); err != nil {
			return err
		}
		s.sink, err = net.Listen("tcp", net.JoinHostPort("::", strconv.Itoa(sinkPort)))
		return err
	})
	if err != nil {
		if s.echo != nil {
			s.echo.Close()
		}
		return nil, err
	}
	s.wg.Go(func() { s.serve(s.echo, func(c net.Conn) { io.Copy(c, c) }) })
	s.wg.Go(func() {
		s.serve(s.sink, func(c net.Conn) {
			buf := make([]byte, 256<<10)
			for {
				n, err := c.Read(buf)
				s.received.Add(int64(n))
				if err != nil {
					return
				}
			}
		})
	})
	return s, nil
}

func (s *server) serve(l net.Listener, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Go(func() { handle(c); c.Close() })
	}
}

func (s *server) close() {
	s.echo.Close()
	s.sink.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// dial connects from the namespace ns.
//
// Possible errors: the namespace cannot be entered; the connection's.
func dial(ns, addr string, port int, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netnsrun.Do(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), timeout)
		return err
	})
	return c, err
}

// rrResult is one request/response run: every round trip's latency.
type rrResult struct {
	latencies []time.Duration
	elapsed   time.Duration
}

func (r rrResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.latencies)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func (r rrResult) perSecond() float64 {
	return float64(len(r.latencies)) / r.elapsed.Seconds()
}

// requestResponse sends one byte and waits for the one byte back, again
// and again on one connection, for d or until stop is closed (nil: d
// only), as netperf's TCP_RR does.
//
// Possible errors: the connection's.
func requestResponse(ns, addr string, d time.Duration, stop <-chan struct{}) (rrResult, error) {
	c, err := dial(ns, addr, echoPort, 2*time.Second)
	if err != nil {
		return rrResult{}, err
	}
	defer c.Close()
	r := rrResult{latencies: make([]time.Duration, 0, 1<<16)}
	b := []byte{1}
	start := time.Now()
	deadline := start.Add(d)
	for {
		t := time.Now()
		if t.After(deadline) {
			break
		}
		if stop != nil {
			select {
			case <-stop:
				r.elapsed = t.Sub(start)
				return r, nil
			default:
			}
		}
		if _, err := c.Write(b); err != nil {
			return r, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return r, err
		}
		r.latencies = append(r.latencies, time.Since(t))
	}
	r.elapsed = time.Since(start)
	return r, nil
}

// bulk writes to the sink for d on one connection and returns the bits a
// second the server read meanwhile.
//
// Possible errors: the connection's.
func bulk(ns, addr string, srv *server, d time.Duration) (float64, error) {
	c, err := dial(ns, addr, sinkPort, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 128<<10)
	// Warm up the window before counting.
	warm := time.Now().Add(100 * time.Millisecond)
	for time.Now().Before(warm) {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	from, start := srv.received.Load(), time.Now()
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	bytes, elapsed := srv.received.Load()-from, time.Since(start)
	return float64(bytes) * 8 / elapsed.Seconds(), nil
}

// connectAttempt is a TCP connect started in a namespace and not waited
// for: a SYN in flight.
type connectAttempt struct {
	fd      int
	started time.Time
}

// startConnect creates a non-blocking socket in the namespace ns and
// starts connecting it to addr:port.
//
// Possible errors: the namespace cannot be entered; socket(2) and
// connect(2)'s but EINPROGRESS.
func startConnect(ns, addr string, port int) (connectAttempt, error) {
	a := netip.MustParseAddr(addr)
	var sa unix.Sockaddr
	domain := unix.AF_INET
	if a.Is4() {
		sa = &unix.SockaddrInet4{Addr: a.As4(), Port: port}
	} else {
		domain = unix.AF_INET6
		sa = &unix.SockaddrInet6{Addr: a.As16(), Port: port}
	}
	at := connectAttempt{fd: -1}
	err := netnsrun.Do(ns, func() (err error) {
		at.fd, err = unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return at, err
	}
	at.started = time.Now()
	if err := unix.Connect(at.fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(at.fd)
		return at, err
	}
	return at, nil
}

// wait waits up to timeout for the connection to be established, closes
// the socket and reports whether it was.
func (a connectAttempt) wait(timeout time.Duration) bool {
	defer unix.Close(a.fd)
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(a.fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(max(left.Milliseconds(), 1)))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		soErr, err := unix.GetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		return err == nil && soErr == 0
	}
}

// connects reports whether a connection from ns to addr:echoPort is
// established within timeout: a dropped SYN is not retried within it.
func connects(ns, addr string, timeout time.Duration) (bool, error) {
	a, err := startConnect(ns, addr, echoPort)
	if err != nil {
		return false, err
	}
	return a.wait(timeout), nil
}

// firstConnect starts a connection attempt to addr every interval from
// the moment it is called until one is established or timeout passes,
// and returns when the first one was established, from the moment it was
// called (a dropped SYN is retransmitted only after a second: a new
// attempt every interval bounds the error to interval and a round trip).
// One loop polls every attempt in flight.
//
// Possible errors: an attempt could not be started; none connected in
// time.
func firstConnect(ns, addr string, interval, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var pending []unix.PollFd
	defer func() {
		for _, p := range pending {
			unix.Close(int(p.Fd))
		}
	}()
	next := start
	for time.Since(start) < timeout {
		if now := time.Now(); !now.Before(next) {
			a, err := startConnect(ns, addr, echoPort)
			if err != nil {
				return 0, err
			}
			pending = append(pending, unix.PollFd{Fd: int32(a.fd), Events: unix.POLLOUT})
			next = now.Add(interval)
		}
		wait := max(time.Until(next), time.Millisecond)
		n, err := unix.Poll(pending, int(wait.Milliseconds()))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return 0, err
		}
		if n <= 0 {
			continue
		}
		connected := false
		kept := pending[:0]
		for _, p := range pending {
			if p.Revents == 0 {
				p.Revents = 0
				kept = append(kept, p)
				continue
			}
			soErr, err := unix.GetsockoptInt(int(p.Fd), unix.SOL_SOCKET, unix.SO_ERROR)
			unix.Close(int(p.Fd))
			connected = connected || (err == nil && soErr == 0)
		}
		pending = kept
		if connected {
			return time.Since(start), nil
		}
	}
	return 0, errors.New("no connection to " + addr + " within " + timeout.String())
}
