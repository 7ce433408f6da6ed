// SPDX-License-Identifier: Apache-2.0

package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Config is a proxy's hooks and bounds. A zero bound takes its default.
type Config struct {
	// Port is the port of both the UDP and the TCP socket; 0 picks a free
	// one (the same for both).
	Port uint16
	// Allow says whether client may ask question q (its name as in the
	// query, with its final dot) of server, the address it sent the query
	// to. False answers RejectRcode without forwarding.
	Allow func(client, server netip.AddrPort, q dns.Question) bool
	// OnAnswer is given each answer before it is sent; the answer waits
	// until it returns or MaxHold passes, whichever is first (ctx is done
	// then, and OnAnswer should return soon after: the proxy does not wait
	// for it, but its goroutine lives until it returns). It must not
	// modify msg.
	OnAnswer func(ctx context.Context, client, server netip.AddrPort, msg *dns.Msg)
	// MaxHold bounds OnAnswer's hold (default 100ms).
	MaxHold time.Duration
	// MaxConcurrent bounds the queries in flight, UDP and TCP together
	// (default 1024); a query beyond it is dropped.
	MaxConcurrent int
	// MaxUDPSize bounds a UDP query and a UDP answer read from a server
	// (default 4096 bytes; TCP messages are bounded by their 16-bit length).
	MaxUDPSize int
	// MaxTCPConns bounds the client TCP connections open at once
	// (default 256).
	MaxTCPConns int
	// Timeout bounds the forwarding of one query to its server and the
	// reading of a TCP query (default 5s).
	Timeout time.Duration
	// RejectRcode is the response code of a query Allow refuses (default
	// dns.RcodeRefused; dns.RcodeNameError makes the name look absent).
	RejectRcode int
	// Observe, if set, is told of each answer sent to its client: how long
	// the query was in the proxy in all, from its arrival to the answer's
	// send, and how much of that its server took.
	Observe func(total, server time.Duration)
}

// Stats counts what the proxy did since it started.
type Stats struct {
	Forwarded    uint64 // answers from a server sent to their client
	Refused      uint64 // queries Allow refused
	Dropped      uint64 // queries over MaxConcurrent, without their original destination, sent to the proxy's own port, or cut short by Close
	ForwardFails uint64 // queries the server did not answer in time (SERVFAIL sent)
	HoldTimeouts uint64 // answers released because MaxHold passed
	// SendFails counts answers that could not be sent to their client:
	// the socket sending from the server's address and port could not be
	// bound (a DNS server in the proxy's own namespace whose socket lacks
	// SO_REUSEADDR holds them).
	SendFails uint64
}

// Proxy is a running transparent DNS proxy.
type Proxy struct {
	cfg     Config
	port    uint16
	servers []*dns.Server // UDP and TCP, IPv4 and IPv6
	// serving has a channel per server, closed when the server returned,
	// which it does once the last of its queries' handlers did.
	serving []chan struct{}
	sem     chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	closeMu sync.Mutex
	closed  bool

	forwarded, refused, dropped, forwardFails, holdTimeouts, sendFails atomic.Uint64
}

// Start opens the proxy's transparent UDP and TCP sockets and serves
// queries until Close.
//
// Possible errors: ErrConfig; ErrListen (not CAP_NET_ADMIN, port in use).
func Start(cfg Config) (*Proxy, error) {
	if cfg.Allow == nil || cfg.OnAnswer == nil {
		return nil, fmt.Errorf("%w: Allow and OnAnswer are required", ErrConfig)
	}
	if cfg.MaxHold < 0 || cfg.MaxConcurrent < 0 || cfg.MaxTCPConns < 0 || cfg.Timeout < 0 ||
		cfg.RejectRcode < 0 || cfg.RejectRcode > 0xf || cfg.MaxUDPSize < 0 || cfg.MaxUDPSize > dns.MaxMsgSize || (cfg.MaxUDPSize > 0 && cfg.MaxUDPSize < dns.MinMsgSize) {
		return nil, fmt.Errorf("%w: a bound out of range", ErrConfig)
	}
	setDefault(&cfg.MaxHold, 100*time.Millisecond)
	setDefault(&cfg.MaxConcurrent, 1024)
	setDefault(&cfg.MaxUDPSize, 4096)
	setDefault(&cfg.MaxTCPConns, 256)
	setDefault(&cfg.Timeout, 5*time.Second)
	setDefault(&cfg.RejectRcode, dns.RcodeRefused)

	pcs, lns, port, err := listen(cfg.Port, cfg.MaxUDPSize)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, port: port, sem: make(chan struct{}, cfg.MaxConcurrent), ctx: ctx, cancel: cancel}
	for _, pc := range pcs {
		p.servers = append(p.servers, &dns.Server{
			PacketConn:     pc,
			Handler:        dns.HandlerFunc(p.serveUDP),
			UDPSize:        cfg.MaxUDPSize,
			DecorateReader: func(dns.Reader) dns.Reader { return origDstReader{maxSize: cfg.MaxUDPSize} },
		})
	}
	// One bound on the TCP connections of both families.
	tcpSlots := make(chan struct{}, cfg.MaxTCPConns)
	for _, ln := range lns {
		p.servers = append(p.servers, &dns.Server{
			Listener:      newLimitListener(ln, tcpSlots),
			Handler:       dns.HandlerFunc(p.serveTCP),
			ReadTimeout:   cfg.Timeout,
			WriteTimeout:  cfg.Timeout,
			MaxTCPQueries: -1,
		})
	}
	for i, srv := range p.servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		errc := make(chan error, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			errc <- srv.ActivateAndServe()
		}()
		select {
		case <-started:
			p.serving = append(p.serving, done)
		case err := <-errc:
			for _, pc := range pcs {
				pc.Close()
			}
			for _, ln := range lns {
				ln.Close()
			}
			p.servers = p.servers[:i]
			p.Close()
			return nil, fmt.Errorf("%w: %v", ErrListen, err)
		}
	}
	return p, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Port is the port of the proxy's sockets.
func (p *Proxy) Port() uint16 { return p.port }

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Forwarded:    p.forwarded.Load(),
		Refused:      p.refused.Load(),
		Dropped:      p.dropped.Load(),
		ForwardFails: p.forwardFails.Load(),
		HoldTimeouts: p.holdTimeouts.Load(),
		SendFails:    p.sendFails.Load(),
	}
}

// Close stops the proxy's servers reading queries, waits for the queries
// in flight (at most Timeout and MaxHold) and closes the sockets.
//
// Possible errors: none so far; the servers' shutdown errors are joined.
func (p *Proxy) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	// The servers stop reading before the forwards' context is cancelled:
	// the other way round, a query read in between, or read before but
	// not yet forwarded, found the context cancelled and got no answer.
	// All servers at once, so that none reads on while another waits for
	// its queries. The wait is bounded: a query has its Timeout for the
	// forward and its MaxHold for the hold, as if the proxy went on; past
	// them the cancel cuts short a forward that began late (after a slow
	// Allow) and releases the holds, so that Close does not wait out a
	// slow server once more (serve then answers nothing). Allow is its
	// owner's to bound.
	grace, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout+p.cfg.MaxHold)
	defer cancel()
	errs := make([]error, len(p.servers))
	var stopped sync.WaitGroup
	for i, srv := range p.servers {
		stopped.Add(1)
		go func() {
			defer stopped.Done()
			errs[i] = srv.ShutdownContext(grace)
		}()
	}
	stopped.Wait()
	p.cancel()
	for _, done := range p.serving {
		<-done
	}
	for i, err := range errs {
		if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed) || err.Error() == "dns: server not started" {
			errs[i] = nil // the bound passed (the cancel saw to it) or the server had stopped
		}
	}
	return errors.Join(errs...)
}

func (p *Proxy) serveUDP(w dns.ResponseWriter, q *dns.Msg) {
	qa, ok := w.RemoteAddr().(*queryAddr)
	if !ok || !qa.server.IsValid() {
		p.dropped.Add(1)
		return
	}
	p.serve(w, q, qa.client, qa.server, "udp")
}

func (p *Proxy) serveTCP(w dns.ResponseWriter, q *dns.Msg) {
	client := addrPort(w.RemoteAddr())
	server := addrPort(w.LocalAddr())
	p.serve(w, q, client, server, "tcp")
}

// serve answers one query. It runs on the DNS server's goroutine for the
// query (UDP) or the connection (TCP).
func (p *Proxy) serve(w dns.ResponseWriter, q *dns.Msg, client, server netip.AddrPort, network string) {
	arrived := time.Now()
	select {
	case p.sem <- struct{}{}:
	default:
		p.dropped.Add(1)
		if network == "tcp" {
			w.Close()
		}
		return
	}
	defer func() { <-p.sem }()

	// A query sent to the proxy's own port rather than steered to it
	// would be forwarded to the proxy itself, again and again.
	if server.Port() == p.port {
		p.dropped.Add(1)
		if network == "tcp" {
			w.Close()
		}
		return
	}

	if len(q.Question) != 1 {
		p.reply(w, new(dns.Msg).SetRcode(q, dns.RcodeFormatError))
		return
	}
	if !p.cfg.Allow(client, server, q.Question[0]) {
		p.refused.Add(1)
		p.reply(w, new(dns.Msg).SetRcode(q, p.cfg.RejectRcode))
		return
	}
	c := &dns.Client{Net: network, Timeout: p.cfg.Timeout, UDPSize: uint16(p.cfg.MaxUDPSize)}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Timeout)
	resp, rtt, err := c.ExchangeContext(ctx, q, server.String())
	cancel()
	if err != nil && p.ctx.Err() != nil {
		// Close cut the forward short (its bound passed): no answer, so
		// that the client asks again (and reaches the next proxy, an
		// agent's restart), where a SERVFAIL would fail the name for it.
		p.dropped.Add(1)
		if network == "tcp" {
			w.Close()
		}
		return
	}
	if err != nil {
		p.forwardFails.Add(1)
		p.reply(w, new(dns.Msg).SetRcode(q, dns.RcodeServerFailure))
		return
	}
	// Packed before the hook sees the answer, so that a hook still reading
	// it after MaxHold races with nothing the proxy does.
	b, err := resp.Pack()
	if err != nil {
		p.forwardFails.Add(1)
		p.reply(w, new(dns.Msg).SetRcode(q, dns.RcodeServerFailure))
		return
	}
	p.hold(client, server, resp)
	if _, err := w.Write(b); err != nil {
		p.sendFails.Add(1)
	} else {
		p.forwarded.Add(1)
		if p.cfg.Observe != nil {
			p.cfg.Observe(time.Since(arrived), rtt)
		}
	}
}

// hold runs OnAnswer and waits for it at most MaxHold.
func (p *Proxy) hold(client, server netip.AddrPort, resp *dns.Msg) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.MaxHold)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.cfg.OnAnswer(ctx, client, server, resp)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		p.holdTimeouts.Add(1)
	}
}

func (p *Proxy) reply(w dns.ResponseWriter, m *dns.Msg) {
	if err := w.WriteMsg(m); err != nil {
		p.sendFails.Add(1)
	}
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
