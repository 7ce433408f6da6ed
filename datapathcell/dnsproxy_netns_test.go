// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// verdictDNSProxy is the policy map's verdict 3: allow, with the DNS the
// endpoint sends steered to the DNS proxy (bpfmaps/abi.go).
const verdictDNSProxy = policy.VerdictDNSProxy

// The DNS test's topology, around the test process's own namespace (the
// host, where the proxy runs): the client (an endpoint, behind the device
// the program is attached to) and the DNS server in namespaces of their
// own. The server also answers on dnsOtherServer, which no policy allows.
var (
	dnsHostClientSide  = netip.MustParseAddr("10.98.1.1")
	dnsClient          = netip.MustParseAddr("10.98.1.2")
	dnsHostServerSide  = netip.MustParseAddr("10.98.2.1")
	dnsServer          = netip.MustParseAddr("10.98.2.2")
	dnsOtherServer     = netip.MustParseAddr("10.98.2.3")
	dnsHostClientSide6 = netip.MustParseAddr("fd98:1::1")
	dnsClient6         = netip.MustParseAddr("fd98:1::2")
	dnsHostServerSide6 = netip.MustParseAddr("fd98:2::1")
	dnsServer6         = netip.MustParseAddr("fd98:2::2")
)

const (
	dnsClientDevice = "dnsc-host"
	dnsServerDevice = "dnss-host"
	// dnsServerIdentity is the servers' identity in the ipcache.
	dnsServerIdentity = testIdentityAllowed
)

// dnsQuery is a query the DNS server saw.
type dnsQuery struct {
	name string
	from netip.Addr
}

// dnsTestServer answers every question with an A record and records what
// it saw.
type dnsTestServer struct {
	mu   sync.Mutex
	seen []dnsQuery
}

// saw returns where the server saw queries for name come from.
func (s *dnsTestServer) saw(name string) []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	var from []netip.Addr
	for _, q := range s.seen {
		if q.name == name {
			from = append(from, q.from)
		}
	}
	return from
}

// dnsTopology is the client and server namespaces.
type dnsTopology struct {
	client string
	server *dnsTestServer
}

// newDNSTopology makes the client and server namespaces linked to the
// calling process's namespace, which routes between them (forwarding
// on: the fail-open case routes queries to the server) and has the
// policy route that delivers packets marked for the proxy locally; it
// starts the DNS server.
func newDNSTopology(t *testing.T) *dnsTopology {
	t.Helper()
	top := &dnsTopology{client: fmt.Sprintf("ipca-dnsc-%d", os.Getpid())}
	serverNS := fmt.Sprintf("ipca-dnss-%d", os.Getpid())
	for _, ns := range []string{top.client, serverNS} {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	for _, l := range []struct {
		ns, dev                  string
		host, peer, host6, peer6 netip.Addr
		extra                    []netip.Addr
	}{
		{top.client, dnsClientDevice, dnsHostClientSide, dnsClient, dnsHostClientSide6, dnsClient6, nil},
		{serverNS, dnsServerDevice, dnsHostServerSide, dnsServer, dnsHostServerSide6, dnsServer6, []netip.Addr{dnsOtherServer}},
	} {
		ipCmd(t, "link", "add", l.dev, "type", "veth", "peer", "name", "eth0", "netns", l.ns)
		ipCmd(t, "addr", "add", l.host.String()+"/24", "dev", l.dev)
		ipCmd(t, "addr", "add", l.host6.String()+"/64", "dev", l.dev, "nodad")
		ipCmd(t, "link", "set", l.dev, "up")
		for _, a := range append([]netip.Addr{l.peer}, l.extra...) {
			ipCmd(t, "-n", l.ns, "addr", "add", a.String()+"/24", "dev", "eth0")
		}
		ipCmd(t, "-n", l.ns, "addr", "add", l.peer6.String()+"/64", "dev", "eth0", "nodad")
		ipCmd(t, "-n", l.ns, "link", "set", "eth0", "up")
		ipCmd(t, "-n", l.ns, "link", "set", "lo", "up")
		ipCmd(t, "-n", l.ns, "route", "add", "default", "via", l.host.String())
		ipCmd(t, "-n", l.ns, "-6", "route", "add", "default", "via", l.host6.String())
	}
	for _, sysctl := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		require.NoError(t, os.WriteFile(sysctl, []byte("1"), 0))
	}
	// The host's policy route for the mark (the agent's to install).
	ipCmd(t, "rule", "add", "fwmark", "0x200/0xf00", "lookup", "2004")
	ipCmd(t, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "2004")
	ipCmd(t, "-6", "rule", "add", "fwmark", "0x200/0xf00", "lookup", "2004")
	ipCmd(t, "-6", "route", "add", "local", "::/0", "dev", "lo", "table", "2004")
	top.server = startDNSTestServer(t, serverNS, dnsServer, dnsOtherServer, dnsServer6)
	return top
}

// startDNSTestServer serves DNS over UDP and TCP on port 53 of addrs,
// with sockets made in the namespace ns.
func startDNSTestServer(t *testing.T, ns string, addrs ...netip.Addr) *dnsTestServer {
	t.Helper()
	s := &dnsTestServer{}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, m *dns.Msg) {
		from, err := netip.ParseAddrPort(w.RemoteAddr().String())
		if err != nil || len(m.Question) != 1 {
			return
		}
		s.mu.Lock()
		s.seen = append(s.seen, dnsQuery{name: m.Question[0].Name, from: from.Addr().Unmap()})
		s.mu.Unlock()
		r := new(dns.Msg).SetReply(m)
		r.Answer = append(r.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   net.IPv4(192, 0, 2, 53),
		})
		w.WriteMsg(r)
	})
	var servers []*dns.Server
	require.NoError(t, netnstest.InNetns(t, ns, func() error {
		for _, a := range addrs {
			ap := netip.AddrPortFrom(a, 53).String()
			pc, err := net.ListenPacket("udp", ap)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", ap)
			if err != nil {
				return err
			}
			servers = append(servers, &dns.Server{PacketConn: pc, Handler: handler}, &dns.Server{Listener: ln, Handler: handler})
		}
		return nil
	}))
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		t.Cleanup(func() { srv.Shutdown() })
	}
	return s
}

// exchange sends a query for name from the client to server port 53 over
// network ("udp" or "tcp"), from the local port local (0: any), and
// returns the answer and where it came from (for UDP read off an
// unconnected socket, which takes a datagram from anyone).
func (top *dnsTopology) exchange(t *testing.T, network string, server netip.Addr, local uint16, name string, timeout time.Duration) (*dns.Msg, netip.AddrPort, error) {
	t.Helper()
	to := netip.AddrPortFrom(server, 53)
	q := new(dns.Msg).SetQuestion(name, dns.TypeA)
	var (
		resp *dns.Msg
		from netip.AddrPort
	)
	err := netnstest.InNetns(t, top.client, func() error {
		deadline := time.Now().Add(timeout)
		if network == "tcp" {
			c, err := net.DialTimeout("tcp", to.String(), timeout)
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
		c, err := net.ListenUDP("udp", &net.UDPAddr{Port: int(local)})
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		b, err := q.Pack()
		if err != nil {
			return err
		}
		if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
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

// proxyAnswers records the clients and names the proxy's OnAnswer saw.
type proxyAnswers struct {
	mu   sync.Mutex
	seen []string // "client-address name"
}

func (a *proxyAnswers) hook(_ context.Context, client, _ netip.AddrPort, m *dns.Msg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, client.Addr().String()+" "+m.Question[0].Name)
}

func (a *proxyAnswers) saw(client netip.Addr, name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.seen, client.String()+" "+name)
}

// TestPrivilegedDNSProxySteering: with the enforcement program on the
// client's device, both directions enforced and the servers'
// identity allowed on UDP and TCP port 53 with verdict 3, the client's
// queries to its server are answered through the proxy (UDP and TCP, IPv4
// and IPv6, queries from one socket every time), from the server's address;
// with verdict 1 they are not steered; a server the policy does not allow
// stays dropped; without a proxy (port 0, or its sockets closed) the
// queries reach their server (fail-open). The answers that bypass the
// proxy while its port is set (verdict 1, the proxy's sockets closed) are
// recorded in the dns-answers ring, the proxy's own answers (its mark)
// and those without a port are not.
func TestPrivilegedDNSProxySteering(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	if !netnstest.InFreshProcessNetns(t, "ipca-dns", true) {
		return
	}
	top := newDNSTopology(t)
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	require.NoError(t, enf.attach(dnsClientDevice, newTestLinksDir(t)))
	putIdentity(t, maps, dnsServer.String()+"/32", dnsServerIdentity)
	putIdentity(t, maps, dnsServer6.String()+"/128", dnsServerIdentity)
	putVerdict := func(v policy.Verdict) {
		t.Helper()
		for _, proto := range []uint8{testProtoUDP, testProtoTCP} {
			require.NoError(t, maps.Policy.Put(policyMapKey(dnsServerIdentity, uint8(policy.Egress), proto, 53), bpfmaps.NewPolicyValue(uint32(v))))
		}
		bumpRevision(t, maps)
	}
	putVerdict(verdictDNSProxy)
	// Both directions default deny: the answers, the proxy's too, pass as
	// replies of the connections the queries made.
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		require.NoError(t, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(0, d), uint32(1)))
	}
	bumpRevision(t, maps)

	var seen proxyAnswers
	p, err := dnsproxy.Start(dnsproxy.Config{
		Allow:    func(netip.AddrPort, netip.AddrPort, dns.Question) bool { return true },
		OnAnswer: seen.hook,
	})
	require.NoError(t, err)
	defer p.Close()
	setPort := func(port uint16) {
		t.Helper()
		require.NoError(t, maps.DNSProxy.Put(uint32(0), bpfmaps.NewDNSProxyValue(port)))
	}
	setPort(p.Port())
	answers, err := ringbuf.NewReader(maps.DNSAnswers)
	require.NoError(t, err)
	defer answers.Close()
	// recorded returns the names of the UDP answers in the ring, as the
	// endpoint and the server each record says, with the address
	// answered (miekg/dns decodes the payload).
	recorded := func(t *testing.T) []string {
		t.Helper()
		var out []string
		for _, a := range readDNSAnswers(t, answers) {
			var m dns.Msg
			require.NoError(t, m.Unpack(a.Payload))
			require.Len(t, m.Answer, 1)
			out = append(out, fmt.Sprintf("%s %s %s %s", a.Endpoint, a.Server, m.Question[0].Name, m.Answer[0].(*dns.A).A))
		}
		return out
	}

	// through says whether a query for name went through the proxy, and
	// direct whether it went straight to the server, from client.
	through := func(client netip.Addr, hostSide netip.Addr, name string) bool {
		return seen.saw(client, name) && slices.Equal(top.server.saw(name), []netip.Addr{hostSide})
	}
	direct := func(client netip.Addr, name string) bool {
		return !seen.saw(client, name) && slices.Equal(top.server.saw(name), []netip.Addr{client})
	}
	answered := func(t *testing.T, network string, server netip.Addr, local uint16, name string) {
		t.Helper()
		resp, from, err := top.exchange(t, network, server, local, name, 2*time.Second)
		require.NoError(t, err, "query %s over %s", name, network)
		require.Equal(t, netip.AddrPortFrom(server, 53), from, "answered from the server's address")
		require.Equal(t, dns.RcodeSuccess, resp.Rcode)
		require.Len(t, resp.Answer, 1)
	}
	families := []struct {
		name           string
		server, client netip.Addr
		hostSide       netip.Addr
	}{
		{"ipv4", dnsServer, dnsClient, dnsHostServerSide},
		{"ipv6", dnsServer6, dnsClient6, dnsHostServerSide6},
	}

	for _, f := range families {
		for _, network := range []string{"udp", "tcp"} {
			t.Run(network+"/"+f.name+"/steered", func(t *testing.T) {
				name := network + "." + f.name + ".steered.example."
				answered(t, network, f.server, 0, name)
				require.True(t, through(f.client, f.hostSide, name),
					"through the proxy: it saw %v, the server from %v", seen.seen, top.server.saw(name))
				require.Empty(t, recorded(t), "the proxy's answers carry its mark")
			})
		}
	}

	// Queries from one socket (glibc sends A and AAAA so) are each a
	// forward packet of one tracked connection: each is steered, the
	// second too, whose entry the first's answer made established.
	t.Run("udp/same-socket", func(t *testing.T) {
		const local = 40053
		for _, name := range []string{"first.same.example.", "second.same.example."} {
			answered(t, "udp", dnsServer, local, name)
			require.True(t, through(dnsClient, dnsHostServerSide, name), name)
		}
		require.Empty(t, recorded(t))
		key := bpfmaps.NewConntrackKey(uint32(mustIfindex(t, dnsClientDevice)),
			netip.AddrPortFrom(dnsClient, local), netip.AddrPortFrom(dnsServer, 53), testProtoUDP)
		var v bpfmaps.ConntrackValue
		require.NoError(t, maps.Conntrack.Lookup(&key, &v), "tracked as an allowed connection, and established")
		require.Equal(t, uint8(policy.Egress), v.Origin())
	})

	t.Run("not-allowed-server", func(t *testing.T) {
		for _, network := range []string{"udp", "tcp"} {
			name := network + ".other.example."
			_, _, err := top.exchange(t, network, dnsOtherServer, 0, name, 500*time.Millisecond)
			require.Error(t, err, "a server no policy allows")
			require.Empty(t, top.server.saw(name))
			require.False(t, seen.saw(dnsClient, name))
		}
	})

	t.Run("verdict-allow-not-steered", func(t *testing.T) {
		putVerdict(policy.VerdictAllow)
		defer putVerdict(verdictDNSProxy)
		for _, f := range families {
			for _, network := range []string{"udp", "tcp"} {
				name := network + "." + f.name + ".allow.example."
				answered(t, network, f.server, 0, name)
				require.True(t, direct(f.client, name), "%s: straight to the server, from %v", name, top.server.saw(name))
			}
			// Not through the proxy while one is configured: recorded
			// (UDP only).
			require.Equal(t, []string{fmt.Sprintf("%s %s udp.%s.allow.example. 192.0.2.53", f.client, f.server, f.name)}, recorded(t))
		}
	})

	// An allow of the server's identity does not carry DNS past the
	// proxy when a DNS rule covers the port for any peer (identity 0's
	// entry): dns-proxy of either lookup wins over allow, as
	// policy.Resolve decides.
	t.Run("any-identity-dns-proxy-wins", func(t *testing.T) {
		putVerdict(policy.VerdictAllow)
		defer putVerdict(verdictDNSProxy)
		for _, proto := range []uint8{testProtoUDP, testProtoTCP} {
			key := policyMapKey(0, uint8(policy.Egress), proto, 53)
			require.NoError(t, maps.Policy.Put(key, bpfmaps.NewPolicyValue(uint32(verdictDNSProxy))))
			defer func() { require.NoError(t, maps.Policy.Delete(key)) }()
		}
		bumpRevision(t, maps)
		for _, network := range []string{"udp", "tcp"} {
			name := network + ".any.example."
			answered(t, network, dnsServer, 0, name)
			require.True(t, through(dnsClient, dnsHostServerSide, name), name)
		}
	})

	// A socket of another process on the pinned port (a crashed agent's
	// port, taken since) carries no proxy mark: the program does not
	// give it the endpoints' DNS, which goes to its server.
	t.Run("foreign-socket-on-port", func(t *testing.T) {
		foreign, err := net.ListenUDP("udp4", &net.UDPAddr{})
		require.NoError(t, err)
		defer foreign.Close()
		setPort(uint16(foreign.LocalAddr().(*net.UDPAddr).Port))
		defer setPort(p.Port())
		name := "udp.foreign.example."
		answered(t, "udp", dnsServer, 0, name)
		require.True(t, direct(dnsClient, name), "%s: straight to the server, from %v", name, top.server.saw(name))
		require.NoError(t, foreign.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
		_, _, err = foreign.ReadFrom(make([]byte, 512))
		require.Error(t, err, "the foreign socket got nothing")
		// Its answer bypassed the proxy while a port is pinned: recorded.
		require.Equal(t, []string{dnsClient.String() + " " + dnsServer.String() + " " + name + " 192.0.2.53"}, recorded(t))
	})

	t.Run("port-0-fail-open", func(t *testing.T) {
		setPort(0)
		defer setPort(p.Port())
		for _, network := range []string{"udp", "tcp"} {
			name := network + ".port0.example."
			answered(t, network, dnsServer, 0, name)
			require.True(t, direct(dnsClient, name), "%s: straight to the server, from %v", name, top.server.saw(name))
		}
		require.Empty(t, recorded(t), "no proxy configured")
	})

	// The agent down: its proxy's sockets are gone, the port stays in the
	// pinned map.
	t.Run("proxy-closed-fail-open", func(t *testing.T) {
		require.NoError(t, p.Close())
		for _, f := range families {
			for _, network := range []string{"udp", "tcp"} {
				name := network + "." + f.name + ".closed.example."
				answered(t, network, f.server, 0, name)
				require.True(t, direct(f.client, name), "%s: straight to the server, from %v", name, top.server.saw(name))
			}
			// The agent-down case: the answer is in the ring for the
			// agent to learn once it is back.
			require.Equal(t, []string{fmt.Sprintf("%s %s udp.%s.closed.example. 192.0.2.53", f.client, f.server, f.name)}, recorded(t))
		}
		lost, err := bpfmaps.ReadDNSAnswersLost(maps.DNSAnswersLost)
		require.NoError(t, err)
		require.Zero(t, lost)
	})
}

// mustIfindex is the index of device in the calling thread's namespace.
func mustIfindex(t *testing.T, device string) int {
	t.Helper()
	iface, err := net.InterfaceByName(device)
	require.NoError(t, err)
	return iface.Index
}
