// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// toFQDNs through the real binary: the endpoint resolves names with a DNS
// server of the test's (on the agent namespace's loopback), through the
// agent's transparent proxy, and connects to the addresses answered.

const (
	dnsServerIP   = "10.201.1.53"
	dnsServerAddr = dnsServerIP + ":53"
	edgeIP        = "10.201.1.3" // www.example.com CNAME edge.example.net
	shortIP       = "10.201.1.4" // short.example.com, TTL 2
	lateIP        = "10.201.1.5" // late.example.com, first resolved while the agent is down
	keepIP        = "10.201.1.6" // keep.example.com, TTL 2, a connection kept open
	// far.example.com and far2.example.com: addresses of the DNS server's
	// namespace, which no owner but the DNS proxy puts in the ipcache.
	farIP  = "10.201.2.1"
	far2IP = "10.201.2.2"
	// lateFarIP is late2.example.com's: as late.example.com, one of those.
	lateFarIP = "10.201.2.3"
	fqdnPort  = "8080"
	// dropTimeout is below the first SYN retransmit (1 s): a connection
	// not made within it had its first SYN dropped.
	dropTimeout = 800 * time.Millisecond
	// connectTimeout is past the first SYN retransmit: whether a
	// connection went through on its first SYN is read from its socket
	// (firstSYN), not from how long it took, which a loaded machine
	// stretches.
	connectTimeout = 3 * time.Second
)

// fqdnPolicy is the host-wide default: web to *.example.com on 8080, DNS to
// the server for *.example.com only (UDP and TCP: the native format has no
// protocol ANY, an absent protocol is both).
const fqdnPolicy = `name: fqdn
egress:
  - toFQDNs: [{matchPattern: "*.example.com"}]
    toPorts: [{port: 8080, protocol: TCP}]
  - toCIDR: ["` + dnsServerIP + `/32"]
    toPorts: [{port: 53, rules: {dns: [{matchPattern: "*.example.com"}]}}]
`

// dnsRecord is what the test's DNS server answers for a name: a CNAME
// (followed in the same answer) or an IPv4 address.
type dnsRecord struct {
	cname string
	addr  string
	ttl   uint32
}

var dnsTable = map[string]dnsRecord{
	"app.example.com.":   {addr: allowedIP, ttl: 60},
	"www.example.com.":   {cname: "edge.example.net.", ttl: 60},
	"edge.example.net.":  {addr: edgeIP, ttl: 60},
	"short.example.com.": {addr: shortIP, ttl: 2},
	"keep.example.com.":  {addr: keepIP, ttl: 2},
	"late.example.com.":  {addr: lateIP, ttl: 60},
	"late2.example.com.": {addr: lateFarIP, ttl: 60},
	"far.example.com.":   {addr: farIP, ttl: 60},
	"far2.example.com.":  {addr: far2IP, ttl: 60},
	"evil.org.":          {addr: otherIP, ttl: 60},
}

// dnsServer answers from dnsTable over UDP and TCP and records the
// questions it saw ("udp app.example.com").
type dnsServer struct {
	mu   sync.Mutex
	seen []string
}

func (s *dnsServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) == 1 {
		q := r.Question[0]
		name := strings.ToLower(q.Name)
		s.mu.Lock()
		s.seen = append(s.seen, w.LocalAddr().Network()+" "+strings.TrimSuffix(name, "."))
		s.mu.Unlock()
		rec, ok := dnsTable[name]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for ok && q.Qtype == dns.TypeA {
			hdr := dns.RR_Header{Name: name, Class: dns.ClassINET, Ttl: rec.ttl}
			if rec.cname != "" {
				hdr.Rrtype = dns.TypeCNAME
				m.Answer = append(m.Answer, &dns.CNAME{Hdr: hdr, Target: rec.cname})
				name = rec.cname
				rec, ok = dnsTable[name]
				continue
			}
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.ParseIP(rec.addr)})
			break
		}
	}
	_ = w.WriteMsg(m)
}

// queried reports whether the server saw a question for name.
func (s *dnsServer) queried(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.seen {
		if strings.HasSuffix(q, " "+name) {
			return true
		}
	}
	return false
}

func (s *dnsServer) seenList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// fqdnRig is the e2e topology with the DNS server in a namespace of its
// own, and echo servers on port 8080 of every address the table names: in
// the agent's namespace (its own addresses) and in the server's (farIP...).
type fqdnRig struct {
	*e2e
	dns   *dnsServer
	dnsNS string
}

// The DNS server's namespace: its link from the agent's namespace (not
// enforced), and the addresses on either side.
const (
	dnsDevice   = "ipcad0"
	dnsHostSide = "10.201.8.1"
	dnsLinkAddr = "10.201.8.2"
)

// dnsNetwork makes the namespace ns of the DNS server, routed by the
// agent's namespace host. The server is not in the agent's namespace: the
// proxy answers from the server's address and port, which a socket there
// bound without SO_REUSEADDR would hold (its answers could not be sent).
func dnsNetwork(t *testing.T, host, ns string) {
	mustRun(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	mustRun(t, "ip", "-n", host, "link", "add", dnsDevice, "type", "veth", "peer", "name", "eth0", "netns", ns)
	mustRun(t, "ip", "-n", host, "addr", "add", dnsHostSide+"/30", "dev", dnsDevice)
	mustRun(t, "ip", "-n", host, "link", "set", dnsDevice, "up")
	mustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", ns, "addr", "add", dnsServerIP+"/32", "dev", "lo")
	mustRun(t, "ip", "-n", ns, "addr", "add", dnsLinkAddr+"/30", "dev", "eth0")
	mustRun(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	mustRun(t, "ip", "-n", ns, "route", "add", "default", "via", dnsHostSide)
	mustRun(t, "ip", "-n", host, "route", "add", dnsServerIP+"/32", "via", dnsLinkAddr)
	for _, ip := range []string{farIP, far2IP, lateFarIP} {
		mustRun(t, "ip", "-n", ns, "addr", "add", ip+"/32", "dev", "lo")
		mustRun(t, "ip", "-n", host, "route", "add", ip+"/32", "via", dnsLinkAddr)
		netnstest.EchoTCP(t, ns, net.JoinHostPort(ip, fqdnPort))
	}
	mustRun(t, "ip", "netns", "exec", host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	require.Eventually(t, func() bool { return pingsFrom(host, dnsServerIP) }, 10*time.Second, 50*time.Millisecond,
		"the agent's namespace reaches the DNS server")
}

// newFQDNRig builds the rig, writes fqdnPolicy and starts the agent (with
// extraArgs) once its DNS goes through the proxy.
func newFQDNRig(t *testing.T, extraArgs ...string) *fqdnRig {
	return newFQDNRigEndpoint(t, "", extraArgs...)
}

// newFQDNRigEndpoint is newFQDNRig where the endpoint namespace is the
// endpoint of the Endpoint document endpointDoc (none if "") of the agent's
// endpoint directory.
func newFQDNRigEndpoint(t *testing.T, endpointDoc string, extraArgs ...string) *fqdnRig {
	e := newE2E(t)
	if endpointDoc != "" {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(endpointDoc), 0o600))
		extraArgs = append(extraArgs, "--endpoint-dir="+dir, "--node-name=node-a")
	}
	for _, ip := range []string{edgeIP, shortIP, lateIP, keepIP} {
		mustRun(t, "ip", "-n", e.hostNS, "addr", "add", ip+"/32", "dev", "lo")
	}
	dnsNS := strings.Replace(e.hostNS, "ipca-host-", "ipca-dns-", 1)
	dnsNetwork(t, e.hostNS, dnsNS)
	for _, ip := range []string{allowedIP, otherIP, edgeIP, shortIP, lateIP, keepIP} {
		netnstest.EchoTCP(t, e.hostNS, net.JoinHostPort(ip, fqdnPort))
	}
	r := &fqdnRig{e2e: e, dns: &dnsServer{}, dnsNS: dnsNS}
	r.serveDNS()
	e.policyFile(policyFile, fqdnPolicy)
	e.extraArgs = append([]string{"--prometheus-serve-addr=127.0.0.1:0"}, extraArgs...)
	e.startAgent()
	r.waitProxy()
	return r
}

// serveDNS starts the DNS server on dnsServerAddr (UDP and TCP) in its
// namespace, stopped when the test ends.
func (r *fqdnRig) serveDNS() {
	t := r.t
	var pc net.PacketConn
	var l net.Listener
	require.NoError(t, netnstest.InNetns(t, r.dnsNS, func() (err error) {
		if pc, err = net.ListenPacket("udp", dnsServerAddr); err != nil {
			return err
		}
		l, err = net.Listen("tcp", dnsServerAddr)
		return err
	}))
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: r.dns}, {Listener: l, Handler: r.dns}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.ActivateAndServe()
		}()
		<-started
		t.Cleanup(func() {
			_ = srv.Shutdown()
			<-done
		})
	}
}

// waitProxy waits until the endpoint's DNS goes through the proxy: a name
// the rules do not allow is refused (before the policy is in force, it
// reaches the server).
func (r *fqdnRig) waitProxy() {
	r.t.Helper()
	var last string
	ok := assertEventually(20*time.Second, 50*time.Millisecond, func() bool {
		in, err := r.query("ready.test.", "udp", 500*time.Millisecond)
		last = fmt.Sprint(in, err)
		return err == nil && in.Rcode == dns.RcodeRefused
	})
	require.True(r.t, ok, "the proxy refuses what the rules do not allow; last answer %s; %s; agent log:\n%s", last, r.debugState(), r.agentLog)
}

// query asks the server for name's A records from the endpoint, over
// network (udp or tcp).
func (r *fqdnRig) query(name, network string, timeout time.Duration) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	var in *dns.Msg
	err := netnstest.InNetns(r.t, r.epNS, func() (err error) {
		c := &dns.Client{Net: network, Timeout: timeout}
		in, _, err = c.Exchange(m, dnsServerAddr)
		return err
	})
	return in, err
}

// resolve queries name and requires addr among the answer's A records.
func (r *fqdnRig) resolve(name, network, addr string) {
	r.t.Helper()
	in, err := r.query(name, network, 2*time.Second)
	require.NoError(r.t, err, "%s over %s; agent log:\n%s", name, network, r.agentLog)
	require.Equal(r.t, dns.RcodeSuccess, in.Rcode, "%s: %s", name, in)
	require.Contains(r.t, answerAddrs(in), addr, "%s: %s", name, in)
}

func answerAddrs(in *dns.Msg) []string {
	var addrs []string
	for _, rr := range in.Answer {
		if a, ok := rr.(*dns.A); ok {
			addrs = append(addrs, a.A.String())
		}
	}
	return addrs
}

// connect opens a TCP connection from the endpoint to ip:8080 on its
// first SYN, and checks that it echoes.
func (r *fqdnRig) connect(ip string) (net.Conn, error) {
	var c net.Conn
	err := netnstest.InNetns(r.t, r.epNS, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip, fqdnPort), connectTimeout)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := firstSYN(c); err != nil {
		c.Close()
		return nil, err
	}
	if err := echoes(c, "hello"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// firstSYN fails unless the connection c was made without retransmitting
// anything: its first SYN was answered. The kernel counts a retransmitted
// SYN in tcpi_total_retrans.
func firstSYN(c net.Conn) error {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var info *unix.TCPInfo
	if err := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("TCP_INFO: %w", err)
	}
	if info.Total_retrans != 0 {
		return fmt.Errorf("connected to %s only after %d retransmissions: the first SYN was dropped", c.RemoteAddr(), info.Total_retrans)
	}
	return nil
}

// reaches reports whether a connection to ip:8080 goes through on its
// first SYN.
func (r *fqdnRig) reaches(ip string) bool {
	c, err := r.connect(ip)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// dropped reports whether a connection to ip:8080 is not made within
// dropTimeout: its first SYN was dropped (a loaded machine can only make
// it slower, never faster).
func (r *fqdnRig) dropped(ip string) bool {
	var c net.Conn
	err := netnstest.InNetns(r.t, r.epNS, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip, fqdnPort), dropTimeout)
		return err
	})
	if err != nil {
		return true
	}
	c.Close()
	return false
}

func echoes(c net.Conn, msg string) error {
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo: got %q, want %q", buf, msg)
	}
	return nil
}

// fqdnEntry is a row of `fqdn cache list -o json`.
type fqdnEntry struct {
	Name     string          `json:"name"`
	Address  netip.Addr      `json:"address"`
	Expires  time.Time       `json:"expires"`
	Deferred bool            `json:"deferred"`
	Identity identity.Number `json:"identity"`
	Endpoint string          `json:"endpoint"`
}

// cacheList runs `ipcache-agent fqdn cache list -o json`.
func (r *fqdnRig) cacheList() []fqdnEntry {
	r.t.Helper()
	stdout, stderr, code := runAgentCommandEnv(r.t, []string{"GORACE=atexit_sleep_ms=0"},
		"fqdn", "cache", "list", "-o", "json", "--shell-sock-path="+filepath.Join(r.stateDir, "shell.sock"))
	require.Zero(r.t, code, "fqdn cache list: %s%s", stdout, stderr)
	var entries []fqdnEntry
	require.NoError(r.t, json.Unmarshal([]byte(stdout), &entries), "%s", stdout)
	return entries
}

// cached returns the cache's entry for name and addr.
func (r *fqdnRig) cached(name, addr string) (fqdnEntry, bool) {
	for _, e := range r.cacheList() {
		if e.Name == name && e.Address.String() == addr {
			return e, true
		}
	}
	return fqdnEntry{}, false
}

func (r *fqdnRig) pinnedID(ip string) (identity.Number, bool) {
	id, ok := r.pinnedIPCache()[netip.MustParsePrefix(ip+"/32")]
	return id, ok
}

// metrics returns the agent's /metrics lines of the fqdn_ metrics, for
// the log.
func (r *fqdnRig) metrics() string {
	r.t.Helper()
	m := metricsAddress.FindStringSubmatch(r.agentLog.String())
	require.NotNil(r.t, m, "the agent logs where it serves metrics: %s", r.agentLog)
	var c net.Conn
	require.NoError(r.t, netnstest.InNetns(r.t, r.hostNS, func() (err error) {
		c, err = net.DialTimeout("tcp", m[1], 2*time.Second)
		return err
	}))
	defer c.Close()
	require.NoError(r.t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", m[1])
	require.NoError(r.t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(r.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(r.t, err)
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.Contains(l, "fqdn_") && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// TestPrivilegedFQDNResolveConnect: a resolved address is allowed on the
// first SYN and an address no answer named stays dropped; a name the
// rules do not allow is refused and never reaches the server; CNAME
// chains; DNS over TCP; the answer comes from the server's address and
// port; the cache list and the monitor's DNS events.
func TestPrivilegedFQDNResolveConnect(t *testing.T) {
	t.Parallel()
	resolveConnect(t, newFQDNRig(t), "")
}

// TestPrivilegedFQDNResolveConnectEndpoint is TestPrivilegedFQDNResolveConnect
// with the client an endpoint of the agent's: its DNS rules are looked up
// by its identity, and the cache and the events name it.
func TestPrivilegedFQDNResolveConnectEndpoint(t *testing.T) {
	t.Parallel()
	doc := fmt.Sprintf("apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: web, namespace: shop, labels: {app: web}}\nspec: {addresses: [%s], interface: %s}\n",
		epAddr, e2eDevice)
	resolveConnect(t, newFQDNRigEndpoint(t, doc), "shop/web")
}

// resolveConnect runs the checks of TestPrivilegedFQDNResolveConnect; the
// client is the endpoint named endpoint ("" none: the host-wide default).
func resolveConnect(t *testing.T, r *fqdnRig, endpoint string) {

	monitor := agentCommand("monitor", "--type", "dns", "-o", "json", "--shell-sock-path="+filepath.Join(r.stateDir, "shell.sock"))
	monitor.Env = append(monitor.Env, "GORACE=atexit_sleep_ms=0")
	var monitorOut syncbuf.Buffer
	monitor.Stdout, monitor.Stderr = &monitorOut, &monitorOut
	require.NoError(t, monitor.Start())
	t.Cleanup(func() {
		monitor.Process.Kill()
		monitor.Wait()
	})
	time.Sleep(300 * time.Millisecond) // the monitor subscribes

	// 1. Before any answer, neither address is allowed; right after the
	// answer, the first SYN to it goes through.
	require.True(t, r.dropped(allowedIP), "not allowed before it is resolved")
	r.resolve("app.example.com.", "udp", allowedIP)
	c, err := r.connect(allowedIP)
	require.NoError(t, err, "first SYN to the answered address; agent log:\n%s", r.agentLog)
	c.Close()
	require.True(t, r.dropped(otherIP), "an address of the same host no answer named stays dropped")

	// Addresses only the answers put in the ipcache: the first SYN too,
	// and the addresses of one selector share one identity.
	require.True(t, r.dropped(farIP), "not allowed before it is resolved")
	for _, far := range []struct{ name, ip string }{{"far.example.com.", farIP}, {"far2.example.com.", far2IP}} {
		_, ok := r.pinnedID(far.ip)
		require.False(t, ok, "%s: in the ipcache map before it is resolved", far.ip)
		r.resolve(far.name, "udp", far.ip)
		c, err := r.connect(far.ip)
		require.NoError(t, err, "first SYN to %s; agent log:\n%s", far.ip, r.agentLog)
		c.Close()
	}
	farID, _ := r.pinnedID(farIP)
	far2ID, _ := r.pinnedID(far2IP)
	require.NotZero(t, farID)
	require.Equal(t, farID, far2ID, "one identity for the selector's addresses")
	require.Regexp(t, `Labels: +cidr:0\.0\.0\.0/0,fqdn:\*\.example\.com\n`, r.shell("ipcache/lookup", farIP))

	// 2. Refused, and never forwarded.
	in, err := r.query("evil.org.", "udp", 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, dns.RcodeRefused, in.Rcode, "%s", in)
	in, err = r.query("evil.org.", "tcp", 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, dns.RcodeRefused, in.Rcode, "%s", in)
	require.False(t, r.dns.queried("evil.org"), "the server saw: %v", r.dns.seenList())
	require.True(t, r.dns.queried("app.example.com"), "the server saw: %v", r.dns.seenList())

	// 3. A CNAME chain, over TCP: the address of the chain's end is
	// allowed on the first SYN.
	require.True(t, r.dropped(edgeIP))
	r.resolve("www.example.com.", "tcp", edgeIP)
	c, err = r.connect(edgeIP)
	require.NoError(t, err, "first SYN to the CNAME's address; agent log:\n%s", r.agentLog)
	c.Close()
	require.Contains(t, r.dns.seenList(), "tcp www.example.com", "the query went over TCP to the server")

	// The answer's source is the server. The client's connected UDP socket
	// (above) only accepts datagrams from the address and port it sent to;
	// an unconnected socket says where the answer came from.
	m := new(dns.Msg)
	m.SetQuestion("app.example.com.", dns.TypeA)
	query, err := m.Pack()
	require.NoError(t, err)
	var from net.Addr
	var answer *dns.Msg
	require.NoError(t, netnstest.InNetns(t, r.epNS, func() error {
		pc, err := net.ListenPacket("udp", epAddr+":0")
		if err != nil {
			return err
		}
		defer pc.Close()
		if _, err := pc.WriteTo(query, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dnsServerAddr))); err != nil {
			return err
		}
		if err := pc.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		from, answer = addr, new(dns.Msg)
		return answer.Unpack(buf[:n])
	}))
	require.Equal(t, dnsServerAddr, from.String(), "the answer comes from the server's address and port")
	require.Equal(t, m.Id, answer.Id)
	require.Equal(t, []string{allowedIP}, answerAddrs(answer))

	// The cache, as `fqdn cache list -o json` shows it.
	app, ok := r.cached("app.example.com", allowedIP)
	require.True(t, ok, "%+v", r.cacheList())
	pinned, ok := r.pinnedID(allowedIP)
	require.True(t, ok)
	require.Equal(t, pinned, app.Identity, "the listed identity is the pinned ipcache's")
	require.WithinDuration(t, time.Now().Add(60*time.Second), app.Expires, 10*time.Second)
	require.False(t, app.Deferred)
	require.Equal(t, endpoint, app.Endpoint, "the endpoint that resolved the name")
	www, ok := r.cached("www.example.com", edgeIP)
	require.True(t, ok, "the chain's address is held by the name asked: %+v", r.cacheList())
	edgeID, _ := r.pinnedID(edgeIP)
	require.Equal(t, edgeID, www.Identity)
	rawList := r.shell("fqdn/cache-list", "-o", "json")
	for _, field := range []string{`"name"`, `"address"`, `"expires"`, `"identity"`, `"endpoint"`} {
		require.Contains(t, rawList, field)
	}

	// The monitor's DNS events: one forwarded, one refused.
	require.Eventually(t, func() bool {
		out := monitorOut.String()
		return strings.Contains(out, `"verdict":"forwarded"`) && strings.Contains(out, `"verdict":"refused"`)
	}, 5*time.Second, 50*time.Millisecond, "monitor --type dns: %s", &monitorOut)
	var forwarded, refused map[string]any
	for _, line := range strings.Split(monitorOut.String(), "\n") {
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		switch {
		case ev["verdict"] == "forwarded" && ev["name"] == "app.example.com":
			forwarded = ev
		case ev["verdict"] == "refused" && ev["name"] == "evil.org":
			refused = ev
		}
	}
	require.NotNil(t, forwarded, "%s", &monitorOut)
	require.NotNil(t, refused, "%s", &monitorOut)
	require.Equal(t, "dns", forwarded["type"])
	require.Equal(t, "NOERROR", forwarded["rcode"])
	require.Equal(t, []any{allowedIP}, forwarded["addresses"])
	require.Equal(t, dnsServerAddr, forwarded["server"])
	require.Equal(t, "REFUSED", refused["rcode"])
	require.Equal(t, "A", refused["qtype"], "the refused question's type")
	if endpoint != "" {
		require.Equal(t, endpoint, forwarded["endpointName"], "%v", forwarded)
		require.Equal(t, endpoint, refused["endpointName"], "%v", refused)
		require.Equal(t, forwarded["endpoint"], refused["endpoint"], "the endpoint's identity")
		require.NotZero(t, forwarded["endpoint"])
	}
	t.Logf("monitor: %s", strings.TrimSpace(monitorOut.String()))
	t.Logf("metrics:\n%s", r.metrics())
}

// TestPrivilegedFQDNTTLExpiry: once its TTL passed, an address no
// connection uses is dropped for new connections; one a connection kept
// open uses stays (deferred) and the connection keeps working.
func TestPrivilegedFQDNTTLExpiry(t *testing.T) {
	t.Parallel()
	r := newFQDNRig(t, "--tofqdns-min-ttl=0", "--tofqdns-gc-interval=200ms", "--conntrack-gc-interval=200ms")

	resolving := time.Now()
	r.resolve("short.example.com.", "udp", shortIP)
	r.resolve("keep.example.com.", "udp", keepIP)
	kept, err := r.connect(keepIP)
	require.NoError(t, err, "first SYN; agent log:\n%s", r.agentLog)
	defer kept.Close()
	short, ok := r.cached("short.example.com", shortIP)
	listed := time.Now()
	require.True(t, ok)
	// The addresses are the agent namespace's own, always in the ipcache
	// map (the host's): learning gives them the selector's identity.
	shortID, _ := r.pinnedID(shortIP)
	require.Equal(t, short.Identity, shortID, "learned into the ipcache map")
	// Its TTL (2 s) from when the answer came, which was between the
	// query and the listing: however long a loaded machine takes over
	// the steps between.
	require.False(t, short.Expires.Before(resolving.Add(2*time.Second).Add(-10*time.Millisecond)), "expires %v, resolved after %v", short.Expires, resolving)
	require.False(t, short.Expires.After(listed.Add(2*time.Second)), "expires %v, listed at %v", short.Expires, listed)

	// Past the TTL (2 s) and a collection or two.
	time.Sleep(3 * time.Second)
	require.Eventually(t, func() bool { id, _ := r.pinnedID(shortIP); return id != shortID }, 5*time.Second, 50*time.Millisecond,
		"the expired address loses its identity in the ipcache map; cache: %+v", r.cacheList())
	_, ok = r.cached("short.example.com", shortIP)
	require.False(t, ok, "expired and unused: gone from the cache")
	require.True(t, r.dropped(shortIP), "a new connection to the expired address is dropped")

	require.NoError(t, echoes(kept, "still there"), "the connection kept open keeps working past the TTL")
	keep, ok := r.cached("keep.example.com", keepIP)
	require.True(t, ok, "the address a connection uses stays: %+v", r.cacheList())
	require.True(t, keep.Deferred, "%+v", keep)
	keepID, _ := r.pinnedID(keepIP)
	require.Equal(t, keep.Identity, keepID, "and keeps its identity in the ipcache map")
	time.Sleep(time.Second)
	require.NoError(t, echoes(kept, "and still"), "a second later")

	// Once the connection is reset (the echo server would keep a
	// half-closed one open) and its conntrack entry gone (the closing
	// timeout), the address goes, and its identity.
	require.NoError(t, kept.(*net.TCPConn).SetLinger(0))
	require.NoError(t, kept.Close())
	closed := time.Now()
	require.Eventually(t, func() bool { _, ok := r.cached("keep.example.com", keepIP); return !ok }, 20*time.Second, 100*time.Millisecond,
		"the deferred address goes once its connection is gone: %+v", r.cacheList())
	t.Logf("the deferred address went %s after its connection was closed", time.Since(closed).Round(time.Millisecond))
	require.Eventually(t, func() bool { id, _ := r.pinnedID(keepIP); return id != keepID }, 5*time.Second, 50*time.Millisecond,
		"and its identity in the ipcache map")
	require.True(t, r.dropped(keepIP), "a new connection to it is dropped")
	t.Logf("metrics:\n%s", r.metrics())
}

// restartLoad is a stream of TCP connections (one every 20 ms) to an
// address and of DNS queries (one every 50 ms, UDP, 1 s timeout, one retry)
// from the endpoint, counting what failed and what needed the retry.
type restartLoad struct {
	stop                         chan struct{}
	wg                           sync.WaitGroup
	conns, connFails             atomic.Int64
	queries, retried, queryFails atomic.Int64
	mu                           sync.Mutex
	failures                     []string
}

func (r *fqdnRig) startLoad(ip, name string) *restartLoad {
	l := &restartLoad{stop: make(chan struct{})}
	fail := func(format string, args ...any) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.failures) < 20 {
			l.failures = append(l.failures, time.Now().UTC().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
		}
	}
	l.wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			l.conns.Add(1)
			c, err := r.connect(ip)
			if err != nil {
				l.connFails.Add(1)
				fail("connect %s: %v", ip, err)
				continue
			}
			c.Close()
		}
	})
	l.wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			l.queries.Add(1)
			in, err := r.query(name, "udp", time.Second)
			if err != nil {
				l.retried.Add(1)
				fail("query %s: %v (retried)", name, err)
				in, err = r.query(name, "udp", time.Second)
			}
			if err != nil || in.Rcode != dns.RcodeSuccess || len(answerAddrs(in)) == 0 {
				l.queryFails.Add(1)
				fail("query %s: %v %v", name, err, in)
			}
		}
	})
	return l
}

func (l *restartLoad) finish(t *testing.T, what string) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	t.Logf("%s: %d connections, %d failed; %d queries, %d needed the retry, %d failed",
		what, l.conns.Load(), l.connFails.Load(), l.queries.Load(), l.retried.Load(), l.queryFails.Load())
	require.Greater(t, l.conns.Load(), int64(50), "%s: too few connections to tell", what)
	require.Zero(t, l.connFails.Load(), "%s: %v", what, l.failures)
	require.Zero(t, l.queryFails.Load(), "%s: %v", what, l.failures)
	if len(l.failures) > 0 {
		t.Logf("%s: retried: %v", what, l.failures)
	}
}

// TestPrivilegedFQDNRestart: across a SIGTERM restart and a SIGKILL
// restart, connections to a resolved address and DNS queries lose
// nothing, the learned address keeps its identity, and an address
// answered while the agent was down is allowed once it is back.
func TestPrivilegedFQDNRestart(t *testing.T) {
	t.Parallel()
	r := newFQDNRig(t)
	r.resolve("app.example.com.", "udp", allowedIP)
	require.True(t, r.reaches(allowedIP))
	before, ok := r.pinnedID(allowedIP)
	require.True(t, ok)
	r.resolve("far.example.com.", "udp", farIP)
	require.True(t, r.reaches(farIP))
	farBefore, ok := r.pinnedID(farIP)
	require.True(t, ok)

	for _, round := range []struct {
		signal   syscall.Signal
		lateName string
		lateIP   string
	}{
		{syscall.SIGTERM, "late.example.com", lateIP},
		{syscall.SIGKILL, "late2.example.com", lateFarIP},
	} {
		what := round.signal.String()
		require.True(t, r.dropped(round.lateIP), "%s: not allowed before it is resolved", what)
		load := r.startLoad(farIP, "far.example.com.")
		time.Sleep(time.Second)
		t.Logf("%s: signal at %s", what, time.Now().UTC().Format("15:04:05.000"))
		require.NoError(t, r.agent.Process.Signal(round.signal))
		_ = r.agent.Wait()
		r.agent = nil
		t.Logf("%s: agent gone at %s", what, time.Now().UTC().Format("15:04:05.000"))
		// While no agent runs, DNS reaches the server directly, and the
		// program records the answers.
		in, err := r.query(round.lateName+".", "udp", time.Second)
		require.NoError(t, err, "%s: DNS while the agent is down", what)
		require.Equal(t, []string{round.lateIP}, answerAddrs(in))
		time.Sleep(300 * time.Millisecond)
		r.startAgent()
		start := time.Now()
		// (The number may be the same as before: restore asks for the
		// pinned numbers again, and the labels the host's identity had are
		// no more in use.)
		learned := assertEventually(5*time.Second, 5*time.Millisecond, func() bool {
			// Until the address is learned, no entry (or the world's)
			// holds it and the lookup fails: not yet.
			out, err := r.tryShell("ipcache/lookup", round.lateIP)
			if err != nil {
				require.ErrorContains(t, err, "no ipcache entry contains", "%s: ipcache/lookup %s: %s", what, round.lateIP, out)
				return false
			}
			return strings.Contains(out, "fqdn:*.example.com")
		})
		require.True(t, learned, "%s: the address answered while the agent was down is learned once it is back; cache %+v; agent log:\n%s",
			what, r.cacheList(), r.agentLog)
		t.Logf("%s: %s learned %s after the agent started", what, round.lateIP, time.Since(start).Round(time.Millisecond))
		require.True(t, r.reaches(round.lateIP), "%s: and allowed on the first SYN, without resolving again", what)
		time.Sleep(2 * time.Second)
		load.finish(t, what)

		after, ok := r.pinnedID(allowedIP)
		require.True(t, ok)
		require.Equal(t, before, after, "%s: the learned address keeps its identity", what)
		app, ok := r.cached("app.example.com", allowedIP)
		require.True(t, ok, "%s: %+v", what, r.cacheList())
		require.Equal(t, before, app.Identity, what)
		farAfter, ok := r.pinnedID(farIP)
		require.True(t, ok)
		far, ok := r.cached("far.example.com", farIP)
		require.True(t, ok, "%s: %+v", what, r.cacheList())
		require.Equal(t, farAfter, far.Identity, what)
		require.Regexp(t, `Labels: +cidr:0\.0\.0\.0/0,fqdn:\*\.example\.com\n`, r.shell("ipcache/lookup", farIP), what)
		// The shared identity keeps its number: restore takes the
		// checkpointed labels of a restored number when they name a prefix
		// covering the entry (cidr:0.0.0.0/0), as the shared set's do.
		require.Equal(t, farBefore, farAfter, "%s: %s keeps its shared identity", what, farIP)
		late, ok := r.cached(round.lateName, round.lateIP)
		require.True(t, ok, "%s: %+v", what, r.cacheList())
		lateID, _ := r.pinnedID(round.lateIP)
		require.Equal(t, lateID, late.Identity)
	}
	t.Logf("metrics:\n%s", r.metrics())
}

// assertEventually polls cond every tick until it holds or wait passed.
func assertEventually(wait, tick time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(tick)
	}
	return true
}

// debugState is what tells why the proxy does not see the endpoint's DNS:
// the policy routing, the proxy's port, the rules and maps.
func (r *fqdnRig) debugState() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"ip", "-n", r.hostNS, "rule"},
		{"ip", "-n", r.hostNS, "route", "show", "table", "2004"},
		{"ip", "netns", "exec", r.hostNS, "ss", "-lunpt"},
		{"bpftool", "map", "dump", "pinned", filepath.Join(r.bpfRoot, "ipcache-agent", "dns-proxy")},
	} {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		fmt.Fprintf(&b, "%v: %v\n%s\n", args, err, out)
	}
	for _, cmd := range [][]string{{"db/show", "dns-rules"}, {"bpf/policy"}, {"bpf/ipcache"}} {
		fmt.Fprintf(&b, "%v:\n%s\n", cmd, r.shell(cmd...))
	}
	fmt.Fprintf(&b, "server saw: %v\nmetrics:\n%s\n", r.dns.seenList(), r.metrics())
	fmt.Fprintf(&b, "datapath/counters:\n%s\n", r.shell("datapath/counters"))
	return b.String()
}
