// SPDX-License-Identifier: Apache-2.0

package dnsproxy_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/dnsproxy/bpf"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// The test's topology: the client (an endpoint) and the DNS server in
// namespaces of their own, each linked by a veth pair to the host
// namespace, which routes between them and runs the proxy.
var (
	hostClientSide = netip.MustParseAddr("10.99.1.1")
	clientAddr     = netip.MustParseAddr("10.99.1.2")
	hostServerSide = netip.MustParseAddr("10.99.2.1")
	serverAddr     = netip.MustParseAddr("10.99.2.2")
	serverAP       = netip.AddrPortFrom(serverAddr, 53)
	answerAddr     = netip.MustParseAddr("192.0.2.10")

	hostClientSide6 = netip.MustParseAddr("fd99:1::1")
	clientAddr6     = netip.MustParseAddr("fd99:1::2")
	hostServerSide6 = netip.MustParseAddr("fd99:2::1")
	serverAddr6     = netip.MustParseAddr("fd99:2::2")
	serverAP6       = netip.AddrPortFrom(serverAddr6, 53)
)

// topology is the namespaces around the calling process's own (the host).
type topology struct {
	client, server string
	dns            *dnsServer
}

// run runs a command, failing tb with its output when it fails.
func run(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newTopology makes the client and server namespaces, routes between them
// through the calling process's namespace, adds the policy route that
// delivers packets marked for the proxy locally, starts the DNS server
// and attaches the steering program at ingress of the client's link
// (proxy_port 0 until setPort).
func newTopology(tb testing.TB) (*topology, *ebpf.Variable) {
	tb.Helper()
	top := &topology{
		client: fmt.Sprintf("dnsp-c-%d", os.Getpid()),
		server: fmt.Sprintf("dnsp-s-%d", os.Getpid()),
	}
	for _, ns := range []string{top.client, top.server} {
		run(tb, "ip", "netns", "add", ns)
		tb.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	for _, l := range []struct {
		ns, host       string
		hostIP, nsIP   netip.Addr
		hostIP6, nsIP6 netip.Addr
	}{
		{top.client, "dnsp-hc", hostClientSide, clientAddr, hostClientSide6, clientAddr6},
		{top.server, "dnsp-hs", hostServerSide, serverAddr, hostServerSide6, serverAddr6},
	} {
		run(tb, "ip", "link", "add", l.host, "type", "veth", "peer", "name", "eth0", "netns", l.ns)
		run(tb, "ip", "addr", "add", l.hostIP.String()+"/24", "dev", l.host)
		run(tb, "ip", "addr", "add", l.hostIP6.String()+"/64", "dev", l.host, "nodad")
		run(tb, "ip", "link", "set", l.host, "up")
		run(tb, "ip", "-n", l.ns, "addr", "add", l.nsIP.String()+"/24", "dev", "eth0")
		run(tb, "ip", "-n", l.ns, "addr", "add", l.nsIP6.String()+"/64", "dev", "eth0", "nodad")
		run(tb, "ip", "-n", l.ns, "link", "set", "eth0", "up")
		run(tb, "ip", "-n", l.ns, "link", "set", "lo", "up")
		run(tb, "ip", "-n", l.ns, "route", "add", "default", "via", l.hostIP.String())
		run(tb, "ip", "-n", l.ns, "-6", "route", "add", "default", "via", l.hostIP6.String())
	}
	setForwarding(tb, "1")
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0); err != nil {
		tb.Fatal(err)
	}
	run(tb, "ip", "rule", "add", "fwmark", "0x200/0xf00", "lookup", "2004")
	run(tb, "ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "2004")
	run(tb, "ip", "-6", "rule", "add", "fwmark", "0x200/0xf00", "lookup", "2004")
	run(tb, "ip", "-6", "route", "add", "local", "::/0", "dev", "lo", "table", "2004")

	top.dns = startDNSServer(tb, top.server)

	var objs bpf.SteerObjects
	if err := bpf.LoadSteerObjects(&objs, nil); err != nil {
		tb.Fatalf("load steering program: %v", err)
	}
	tb.Cleanup(func() { objs.Close() })
	ifc, err := net.InterfaceByName("dnsp-hc")
	if err != nil {
		tb.Fatal(err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: objs.SteerDns, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		tb.Fatalf("attach steering program: %v", err)
	}
	tb.Cleanup(func() { l.Close() })
	return top, objs.ProxyPort
}

// query is what the DNS server saw: the name and where it came from.
type query struct {
	name string
	from netip.Addr
	net  string
}

// dnsServer answers every A question with answerAddr (a name starting
// with "slow." after a second) and records the queries it saw.
type dnsServer struct {
	mu   sync.Mutex
	seen []query
}

func (s *dnsServer) queries() []query {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]query(nil), s.seen...)
}

func (s *dnsServer) sawName(name string) []query {
	var out []query
	for _, q := range s.queries() {
		if q.name == name {
			out = append(out, q)
		}
	}
	return out
}

// startDNSServer serves DNS on serverAP (UDP and TCP) with sockets made
// in the namespace ns.
func startDNSServer(tb testing.TB, ns string) *dnsServer {
	tb.Helper()
	s := &dnsServer{}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, m *dns.Msg) {
		var from netip.AddrPort
		switch a := w.RemoteAddr().(type) {
		case *net.UDPAddr:
			from = a.AddrPort()
		case *net.TCPAddr:
			from = a.AddrPort()
		}
		s.mu.Lock()
		s.seen = append(s.seen, query{name: m.Question[0].Name, from: from.Addr().Unmap(), net: w.RemoteAddr().Network()})
		s.mu.Unlock()
		if strings.HasPrefix(m.Question[0].Name, "slow.") {
			// A query in flight for a while (the proxy's Close meanwhile).
			time.Sleep(time.Second)
		}
		r := new(dns.Msg).SetReply(m)
		r.Answer = append(r.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   answerAddr.AsSlice(),
		})
		w.WriteMsg(r)
	})
	var servers []*dns.Server
	err := netnstest.InNetns(tb, ns, func() error {
		for _, ap := range []netip.AddrPort{serverAP, serverAP6} {
			pc, err := net.ListenPacket("udp", ap.String())
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", ap.String())
			if err != nil {
				return err
			}
			servers = append(servers, &dns.Server{PacketConn: pc, Handler: handler}, &dns.Server{Listener: ln, Handler: handler})
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("DNS server in %s: %v", ns, err)
	}
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		tb.Cleanup(func() { srv.Shutdown() })
	}
	return s
}

// exchange sends a query for name from the client namespace to the
// server's address over network, and returns the answer and the address
// it came from (for UDP read off an unconnected socket, which takes a
// datagram from anyone).
func (top *topology) exchange(tb testing.TB, network, name string) (*dns.Msg, netip.AddrPort, error) {
	return top.exchangeWith(tb, network, serverAP, name)
}

// exchangeWith is exchange with the server at server.
func (top *topology) exchangeWith(tb testing.TB, network string, server netip.AddrPort, name string) (*dns.Msg, netip.AddrPort, error) {
	tb.Helper()
	q := new(dns.Msg).SetQuestion(name, dns.TypeA)
	var (
		resp *dns.Msg
		from netip.AddrPort
	)
	err := netnstest.InNetns(tb, top.client, func() error {
		deadline := time.Now().Add(2 * time.Second)
		if network == "tcp" {
			c, err := net.DialTimeout("tcp", server.String(), 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(deadline)
			co := &dns.Conn{Conn: c}
			if err := co.WriteMsg(q); err != nil {
				return err
			}
			resp, err = co.ReadMsg()
			from = c.RemoteAddr().(*net.TCPAddr).AddrPort()
			return err
		}
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		b, err := q.Pack()
		if err != nil {
			return err
		}
		if _, err := c.WriteToUDPAddrPort(b, server); err != nil {
			return err
		}
		buf := make([]byte, 4096)
		n, src, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return err
		}
		from = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		resp = new(dns.Msg)
		return resp.Unpack(buf[:n])
	})
	return resp, from, err
}

// answers records what the proxy's OnAnswer hook saw.
type answers struct {
	mu   sync.Mutex
	seen []string // "client name"
}

// hook records the answer; it holds one for a name starting with "hold."
// until its ctx is done.
func (a *answers) hook(ctx context.Context, client, _ netip.AddrPort, m *dns.Msg) {
	if strings.HasPrefix(m.Question[0].Name, "hold.") {
		<-ctx.Done()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, client.Addr().String()+" "+m.Question[0].Name)
}

func (a *answers) saw(s string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, x := range a.seen {
		if x == s {
			return true
		}
	}
	return false
}

func allowExample(_, _ netip.AddrPort, q dns.Question) bool {
	return strings.HasSuffix(q.Name, ".allowed.example.")
}

// setForwarding sets IPv4 forwarding in the calling thread's namespace.
func setForwarding(tb testing.TB, v string) {
	tb.Helper()
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(v), 0); err != nil {
		tb.Fatal(err)
	}
}
