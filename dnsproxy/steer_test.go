// SPDX-License-Identifier: Apache-2.0

package dnsproxy_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// TestSteeredProxy runs the proxy in the test's own namespace between a
// client and a DNS server in namespaces of their own, with the steering
// program at ingress of the client's link: queries the client sends to
// the server's address reach the proxy, which forwards the allowed ones
// from the host's address and answers from the server's; with the proxy
// gone, the program lets queries through to the server.
const maxHold = 50 * time.Millisecond

func TestSteeredProxy(t *testing.T) {
	privileged.Test(t)
	if !netnstest.InFreshProcessNetns(t, "dnsproxy", true) {
		return
	}
	top, port := newTopology(t)
	var seen answers
	p, err := dnsproxy.Start(dnsproxy.Config{Allow: allowExample, OnAnswer: seen.hook, MaxHold: maxHold})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := port.Set(p.Port()); err != nil {
		t.Fatal(err)
	}

	for _, network := range []string{"udp", "tcp"} {
		t.Run(network+"/allowed", func(t *testing.T) {
			name := network + ".allowed.example."
			resp, from, err := top.exchange(t, network, name)
			if err != nil {
				t.Fatalf("query %s: %v", name, err)
			}
			if from != serverAP {
				t.Errorf("answer from %v, want the server's %v", from, serverAP)
			}
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != answerAddr.String() {
				t.Errorf("answer %v, want %s A %s", resp, name, answerAddr)
			}
			qs := top.dns.sawName(name)
			if len(qs) != 1 || qs[0].from != hostServerSide || qs[0].net != network {
				t.Errorf("server saw %v, want one %s query from the host's %s", qs, network, hostServerSide)
			}
			if !seen.saw(clientAddr.String() + " " + name) {
				t.Errorf("OnAnswer did not see %s from %s", name, clientAddr)
			}
		})
		t.Run(network+"/refused", func(t *testing.T) {
			name := network + ".refused.example."
			resp, from, err := top.exchange(t, network, name)
			if err != nil {
				t.Fatalf("query %s: %v", name, err)
			}
			if from != serverAP {
				t.Errorf("answer from %v, want the server's %v", from, serverAP)
			}
			if resp.Rcode != dns.RcodeRefused {
				t.Errorf("rcode %s, want REFUSED", dns.RcodeToString[resp.Rcode])
			}
			if qs := top.dns.sawName(name); len(qs) != 0 {
				t.Errorf("server saw refused name: %v", qs)
			}
		})
	}
	// The handler counts a forward after its client has the answer: the
	// last one may be counted a moment after the query returned.
	deadline := time.Now().Add(time.Second)
	for st := p.Stats(); st.Forwarded != 2 || st.Refused != 2; st = p.Stats() {
		if time.Now().After(deadline) {
			t.Errorf("stats %+v, want 2 forwarded and 2 refused", st)
			break
		}
		time.Sleep(time.Millisecond)
	}

	// IPv6 as IPv4: the answer from the server's address, the query from
	// the host's, refused names not forwarded.
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network+"6", func(t *testing.T) {
			name := network + "6.allowed.example."
			resp, from, err := top.exchangeWith(t, network, serverAP6, name)
			if err != nil {
				t.Fatalf("query %s: %v", name, err)
			}
			if from != serverAP6 || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Errorf("answer %v from %v, want one from the server's %v", resp, from, serverAP6)
			}
			if qs := top.dns.sawName(name); len(qs) != 1 || qs[0].from != hostServerSide6 {
				t.Errorf("server saw %v, want one query from the host's %s", qs, hostServerSide6)
			}
			if !seen.saw(clientAddr6.String() + " " + name) {
				t.Errorf("OnAnswer did not see %s from %s", name, clientAddr6)
			}
			name = network + "6.refused.example."
			resp, _, err = top.exchangeWith(t, network, serverAP6, name)
			if err != nil || resp.Rcode != dns.RcodeRefused {
				t.Errorf("query %s: %v %v, want REFUSED", name, resp, err)
			}
			if qs := top.dns.sawName(name); len(qs) != 0 {
				t.Errorf("server saw refused name: %v", qs)
			}
		})
	}

	// The steered packet is delivered locally, not forwarded: it needs
	// no forwarding on the host (the proxy's own query to the server is
	// sent by the host, not forwarded either).
	t.Run("udp/no-forwarding", func(t *testing.T) {
		setForwarding(t, "0")
		defer setForwarding(t, "1")
		name := "udp.nofwd.allowed.example."
		resp, from, err := top.exchange(t, "udp", name)
		if err != nil || resp.Rcode != dns.RcodeSuccess || from != serverAP {
			t.Fatalf("query %s without forwarding: %v from %v: %v", name, resp, from, err)
		}
		if qs := top.dns.sawName(name); len(qs) != 1 || qs[0].from != hostServerSide {
			t.Errorf("server saw %v, want one query from the host's %s", qs, hostServerSide)
		}
	})

	// An answer OnAnswer does not release goes out when MaxHold passes.
	t.Run("udp/hold-timeout", func(t *testing.T) {
		before := p.Stats()
		start := time.Now()
		resp, _, err := top.exchange(t, "udp", "hold.udp.allowed.example.")
		if err != nil || resp.Rcode != dns.RcodeSuccess {
			t.Fatalf("held query: %v %v", resp, err)
		}
		if d := time.Since(start); d < maxHold {
			t.Errorf("answer after %v, want it held %v", d, maxHold)
		}
		if got := p.Stats().HoldTimeouts - before.HoldTimeouts; got != 1 {
			t.Errorf("hold timeouts +%d, want +1", got)
		}
	})

	// A query sent to the proxy's port itself, not steered, is dropped
	// rather than forwarded to the proxy.
	t.Run("udp/to-proxy-port", func(t *testing.T) {
		before := p.Stats()
		c, err := dns.Dial("udp", netip.AddrPortFrom(hostClientSide, p.Port()).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if err := c.WriteMsg(new(dns.Msg).SetQuestion("self.allowed.example.", dns.TypeA)); err != nil {
			t.Fatal(err)
		}
		if m, err := c.ReadMsg(); err == nil {
			t.Errorf("answer %v, want none", m)
		}
		if got := p.Stats().Dropped - before.Dropped; got != 1 {
			t.Errorf("dropped +%d, want +1", got)
		}
	})

	// A query in flight when the proxy closes gets its answer, not a
	// SERVFAIL, which a client takes for the name's failure: Close waits
	// for it.
	t.Run("udp/closed-while-forwarding", func(t *testing.T) {
		closing := startSteered(t, port, p.Port(), dnsproxy.Config{Allow: allowExample, OnAnswer: seen.hook, MaxHold: maxHold})
		name := "slow.closing.allowed.example."
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			for len(top.dns.sawName(name)) == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			closing.Close()
		}()
		resp, _, err := top.exchange(t, "udp", name)
		if err != nil || resp.Rcode != dns.RcodeSuccess {
			t.Errorf("query in flight when the proxy closed: %v %v, want its answer", resp, err)
		}
		<-closed // Close returns once the query's handler did, counted
		if st := closing.Stats(); st.ForwardFails != 0 || st.Forwarded != 1 {
			t.Errorf("stats %+v, want it forwarded, no forward failure", st)
		}
	})

	// A query read before Close and forwarded once Close began gets its
	// answer: Close stops the servers reading before it cancels the
	// forwards. Its Allow hook returns only when the proxy's listeners
	// refuse connections (Close began), or after a second: the other way
	// round the forward found the context cancelled and the query got no
	// answer.
	t.Run("udp/forwarded-after-close-began", func(t *testing.T) {
		var proxyPort atomic.Uint32
		entered := make(chan struct{}, 1)
		allow := func(client, server netip.AddrPort, q dns.Question) bool {
			if strings.HasPrefix(q.Name, "late.") {
				entered <- struct{}{}
				waitRefused(netip.AddrPortFrom(hostClientSide, uint16(proxyPort.Load())), time.Second)
			}
			return allowExample(client, server, q)
		}
		closing := startSteered(t, port, p.Port(), dnsproxy.Config{Allow: allow, OnAnswer: seen.hook, MaxHold: maxHold})
		proxyPort.Store(uint32(closing.Port()))
		closed := make(chan error, 1)
		go func() {
			<-entered
			closed <- closing.Close()
		}()
		name := "late.closing.allowed.example."
		resp, _, err := top.exchange(t, "udp", name)
		if err != nil || resp.Rcode != dns.RcodeSuccess {
			t.Errorf("query forwarded after Close began: %v %v, want its answer", resp, err)
		}
		if err := <-closed; err != nil {
			t.Errorf("Close: %v", err)
		}
		if st := closing.Stats(); st.Forwarded != 1 || st.Dropped != 0 || st.ForwardFails != 0 {
			t.Errorf("stats %+v, want it forwarded, nothing dropped or failed", st)
		}
	})

	// Close's wait is bounded by Timeout and MaxHold: a forward that
	// begins past them (its Allow hook slower than that) is cut short,
	// and the query gets no answer rather than a SERVFAIL once its slow
	// server timed out.
	t.Run("udp/cut-short-by-close", func(t *testing.T) {
		var proxyPort atomic.Uint32
		entered := make(chan struct{}, 1)
		const timeout = 100 * time.Millisecond
		allow := func(client, server netip.AddrPort, q dns.Question) bool {
			entered <- struct{}{}
			waitRefused(netip.AddrPortFrom(hostClientSide, uint16(proxyPort.Load())), time.Second)
			time.Sleep(4 * (timeout + maxHold))
			return allowExample(client, server, q)
		}
		closing := startSteered(t, port, p.Port(), dnsproxy.Config{Allow: allow, OnAnswer: seen.hook, MaxHold: maxHold, Timeout: timeout})
		proxyPort.Store(uint32(closing.Port()))
		closed := make(chan error, 1)
		go func() {
			<-entered
			closed <- closing.Close()
		}()
		if resp, _, err := top.exchange(t, "udp", "slow.cut.allowed.example."); err == nil {
			t.Errorf("answer %v to a query cut short by Close, want none", resp)
		}
		if err := <-closed; err != nil {
			t.Errorf("Close: %v", err)
		}
		if st := closing.Stats(); st.Dropped != 1 || st.ForwardFails != 0 || st.Forwarded != 0 {
			t.Errorf("stats %+v, want it dropped, no forward failure", st)
		}
	})

	// Beyond MaxConcurrent a query is dropped: with one query held in a
	// proxy of one, the next gets no answer.
	t.Run("udp/over-max-concurrent", func(t *testing.T) {
		entered := make(chan struct{}, 1)
		one := startSteered(t, port, p.Port(), dnsproxy.Config{
			Allow: allowExample,
			OnAnswer: func(ctx context.Context, _, _ netip.AddrPort, _ *dns.Msg) {
				entered <- struct{}{}
				<-ctx.Done()
			},
			MaxHold:       500 * time.Millisecond,
			MaxConcurrent: 1,
		})
		held := make(chan error, 1)
		go func() {
			_, _, err := top.exchange(t, "udp", "first.allowed.example.")
			held <- err
		}()
		<-entered
		if resp, _, err := top.exchange(t, "udp", "second.allowed.example."); err == nil {
			t.Errorf("answer %v beyond MaxConcurrent, want none", resp)
		}
		if err := <-held; err != nil {
			t.Errorf("held query: %v", err)
		}
		if st := one.Stats(); st.Dropped != 1 || st.Forwarded != 1 {
			t.Errorf("stats %+v, want 1 dropped and 1 forwarded", st)
		}
		if qs := top.dns.sawName("second.allowed.example."); len(qs) != 0 {
			t.Errorf("server saw the dropped query: %v", qs)
		}
	})

	// bpf_sk_assign does not make the packet local: without the policy
	// route its destination is routed, and a forwarded packet with a
	// socket is dropped. Neither the proxy nor the server sees it.
	t.Run("udp/no-local-route", func(t *testing.T) {
		run(t, "ip", "rule", "del", "fwmark", "0x200/0xf00", "lookup", "2004")
		defer run(t, "ip", "rule", "add", "fwmark", "0x200/0xf00", "lookup", "2004")
		before := p.Stats()
		name := "udp.noroute.allowed.example."
		if resp, from, err := top.exchange(t, "udp", name); err == nil {
			t.Errorf("answer %v from %v without the policy route, want none", resp, from)
		}
		if qs := top.dns.sawName(name); len(qs) != 0 || p.Stats() != before {
			t.Errorf("server saw %v, proxy stats %+v then %+v: want the query lost", qs, before, p.Stats())
		}
	})

	// Fail-open: the proxy's sockets gone (the agent down), the program
	// finds none and queries, even names the proxy would refuse, go to
	// their server straight from the client.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Go closes a socket's descriptor once its last reader has returned,
	// which may be just after Close: wait until the port is free, as it
	// is once an agent has exited.
	waitPortFree(t, p.Port())
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network+"/proxy-gone", func(t *testing.T) {
			name := network + ".down.refused.example."
			resp, from, err := top.exchange(t, network, name)
			if err != nil {
				t.Fatalf("query %s: %v", name, err)
			}
			if from != serverAP || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Errorf("answer %v from %v, want the server's", resp, from)
			}
			qs := top.dns.sawName(name)
			if len(qs) != 1 || qs[0].from != clientAddr {
				t.Errorf("server saw %v, want one query straight from the client %s", qs, clientAddr)
			}
			name = network + "6.down.refused.example."
			resp, from, err = top.exchangeWith(t, network, serverAP6, name)
			if err != nil || from != serverAP6 || resp.Rcode != dns.RcodeSuccess {
				t.Errorf("query %s: %v from %v: %v, want the server's answer", name, resp, from, err)
			}
			if qs := top.dns.sawName(name); len(qs) != 1 || qs[0].from != clientAddr6 {
				t.Errorf("server saw %v, want one query straight from the client %s", qs, clientAddr6)
			}
		})
	}

	// The proxy back (the agent restarted): a TCP connection opened to
	// the server meanwhile stays with the server, a new one goes through
	// the proxy.
	t.Run("tcp/proxy-back", func(t *testing.T) {
		var c net.Conn
		if err := netnstest.InNetns(t, top.client, func() (err error) {
			c, err = net.DialTimeout("tcp", serverAP.String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		co := &dns.Conn{Conn: c}
		ask := func(name string) {
			t.Helper()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if err := co.WriteMsg(new(dns.Msg).SetQuestion(name, dns.TypeA)); err != nil {
				t.Fatalf("query %s: %v", name, err)
			}
			if resp, err := co.ReadMsg(); err != nil || resp.Rcode != dns.RcodeSuccess {
				t.Fatalf("query %s: %v %v", name, resp, err)
			}
		}
		ask("before.back.refused.example.")
		back, err := dnsproxy.Start(dnsproxy.Config{Allow: allowExample, OnAnswer: seen.hook})
		if err != nil {
			t.Fatal(err)
		}
		defer back.Close()
		if err := port.Set(back.Port()); err != nil {
			t.Fatal(err)
		}
		ask("after.back.refused.example.")
		for _, name := range []string{"before.back.refused.example.", "after.back.refused.example."} {
			if qs := top.dns.sawName(name); len(qs) != 1 || qs[0].from != clientAddr {
				t.Errorf("server saw %v, want one query on the client's own connection", qs)
			}
		}
		resp, _, err := top.exchange(t, "tcp", "new.back.refused.example.")
		if err != nil || resp.Rcode != dns.RcodeRefused {
			t.Errorf("new connection: %v %v, want REFUSED by the proxy", resp, err)
		}
	})
}

func TestStartConfig(t *testing.T) {
	allow := func(netip.AddrPort, netip.AddrPort, dns.Question) bool { return true }
	hook := func(context.Context, netip.AddrPort, netip.AddrPort, *dns.Msg) {}
	for name, cfg := range map[string]dnsproxy.Config{
		"no Allow":           {OnAnswer: hook},
		"no OnAnswer":        {Allow: allow},
		"negative hold":      {Allow: allow, OnAnswer: hook, MaxHold: -1},
		"UDP size too big":   {Allow: allow, OnAnswer: hook, MaxUDPSize: 70000},
		"UDP size too small": {Allow: allow, OnAnswer: hook, MaxUDPSize: 100},
	} {
		if p, err := dnsproxy.Start(cfg); !errors.Is(err, dnsproxy.ErrConfig) {
			if p != nil {
				p.Close()
			}
			t.Errorf("%s: Start: %v, want ErrConfig", name, err)
		}
	}
}

// waitPortFree waits (up to 2s) until a UDP socket can be bound to port.
func waitPortFree(t *testing.T, port uint16) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c, err := net.ListenUDP("udp", &net.UDPAddr{Port: int(port)})
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d still taken after the proxy closed: %v", port, err)
		}
	}
}

// waitRefused waits (up to bound) until a TCP connection to ap is
// refused: the listener there is closed.
func waitRefused(ap netip.AddrPort, bound time.Duration) {
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", ap.String(), 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
	}
}

// startSteered starts a proxy with cfg and steers the client's queries to
// it; when the subtest ends they go to the port back again, and the proxy
// is closed (if the subtest did not).
func startSteered(t *testing.T, port *ebpf.Variable, back uint16, cfg dnsproxy.Config) *dnsproxy.Proxy {
	t.Helper()
	p, err := dnsproxy.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := port.Set(p.Port()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := port.Set(back); err != nil {
			t.Errorf("steer back to port %d: %v", back, err)
		}
	})
	return p
}
