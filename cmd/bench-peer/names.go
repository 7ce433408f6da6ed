// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/internal/netnsrun"
)

// The names comparison's modes: the client's resolver forwards with no
// filter (forward), or the client asks the server's DNS server itself with
// no filter (direct); the agent's toFQDNs; dnsmasq's --nftset.
const (
	modeDirect  = "direct"
	modeForward = "forward"
)

// The names comparison's addresses: the DNS server in the server
// namespace, and the names' addresses, routed by the router to the server
// (bound there as /32s): one per name, then the unasked name's, then the
// warm-up's (the agent's readiness probe).
const (
	namesDNSServer = "10.250.1.250"
	namesDomain    = "bpeer.test"
	namesBase      = 0x0afa_0400 // 10.250.4.0
	namesRoute     = "10.250.4.0/22"
	maxNames       = 1000
)

// ErrNoDnsmasq is dnsmasq missing: the names comparison needs it.
var ErrNoDnsmasq = errors.New("dnsmasq is missing (Debian's dnsmasq-base): the names comparison needs it")

func nameOf(i int) string { return fmt.Sprintf("n%04d.%s", i, namesDomain) }

func nameAddr(i int) string {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], uint32(namesBase+1+i))
	return netip.AddrFrom4(a).String()
}

// NamesResult is the names comparison's figures, each mode's in fresh
// namespaces.
type NamesResult struct {
	Names int               `json:"names"`
	Modes []NamesModeResult `json:"modes"`
}

// NamesModeResult is one mode's figures over every name, each asked once
// in turn: the query's round trip from the client, and the time from the
// query's start until the first connection to the answered address is
// established.
type NamesModeResult struct {
	Mode            string  `json:"mode"`
	QueryP50Micros  float64 `json:"queryP50Micros"`
	QueryP99Micros  float64 `json:"queryP99Micros"`
	ConnectP50Micro float64 `json:"connectP50Micros"`
	ConnectP99Micro float64 `json:"connectP99Micros"`
	// FirstDropped: names whose first connection was not established
	// within 300 ms (a dropped SYN is resent after a second); the time to
	// connect is then that of a later attempt.
	FirstDropped int `json:"firstDropped"`
	// UnaskedConnects: an address whose name was never asked connects (it
	// must not under a filter, and must with none).
	UnaskedConnects bool `json:"unaskedConnects"`
}

// runNames builds namespaces per mode, runs the names comparison in them
// and removes them.
//
// Possible errors: ErrNoDnsmasq; ErrNotFiltering; the namespaces, the
// agent, nft, dnsmasq or the traffic failed.
func runNames(cfg config, names int) (NamesResult, error) {
	res := NamesResult{Names: names}
	if _, err := exec.LookPath("dnsmasq"); err != nil {
		return res, ErrNoDnsmasq
	}
	for _, mode := range []string{modeDirect, modeForward, modeAgent, modeNft} {
		if mode == modeAgent || mode == modeNft {
			if !slices.Contains(cfg.modes, mode) {
				continue
			}
		}
		fmt.Fprintf(cfg.progress, "bench-peer: names %d: %s\n", names, mode)
		m, err := runNamesMode(cfg, names, mode)
		if err != nil {
			return res, fmt.Errorf("names %s: %w", mode, err)
		}
		res.Modes = append(res.Modes, m)
	}
	return res, nil
}

func runNamesMode(cfg config, names int, mode string) (NamesModeResult, error) {
	m := NamesModeResult{Mode: mode}
	topo, err := newTopology(fmt.Sprintf("bpeer-%d", os.Getpid()))
	if err != nil {
		return m, err
	}
	defer cfg.undo.add(topo.remove)()
	work, err := os.MkdirTemp(cfg.work, "names-")
	if err != nil {
		return m, err
	}
	if err := addNameAddrs(topo, names+2); err != nil {
		return m, err
	}
	srv, err := startServer(topo.server)
	if err != nil {
		return m, err
	}
	defer srv.close()
	// The names' DNS server: an address per name, TTL 60 s.
	args := []string{"--local-ttl=60"}
	for i := range names + 2 {
		args = append(args, fmt.Sprintf("--address=/%s/%s", nameOf(i), nameAddr(i)))
	}
	upstream, err := startDnsmasq(topo.server, namesDNSServer, args...)
	if err != nil {
		return m, err
	}
	defer cfg.undo.add(upstream.stop)()
	resolver := namesDNSServer
	warm := names + 1
	switch mode {
	case modeDirect:
	case modeForward, modeNft:
		if mode == modeNft {
			if err := loadNamesRuleset(topo.router); err != nil {
				return m, err
			}
			defer func() {
				_ = exec.Command("ip", "netns", "exec", topo.router, "nft", "delete", "table", "inet", nftTable).Run()
			}()
		}
		args := []string{"--server=" + namesDNSServer, "--cache-size=0"}
		if mode == modeNft {
			args = append(args, "--nftset=/"+namesDomain+"/4#inet#"+nftTable+"#names4")
		}
		fwd, err := startDnsmasq(topo.router, routerClientV4, args...)
		if err != nil {
			return m, err
		}
		defer cfg.undo.add(fwd.stop)()
		resolver = routerClientV4
	case modeAgent:
		a, err := newAgentRun(cfg.agentBinary, topo.router, work)
		if err != nil {
			return m, err
		}
		defer cfg.undo.add(a.stop)()
		if err := writeNamesPolicy(a.policyDir); err != nil {
			return m, err
		}
		if err := a.start(0); err != nil {
			return m, err
		}
		if err := waitNamesEnforced(a, topo.client, warm, 60*time.Second); err != nil {
			return m, err
		}
	}
	if err := waitResolves(topo.client, resolver, warm, 10*time.Second); err != nil {
		return m, err
	}
	// A dropped SYN is resent after 1 s: 300 ms tells a drop.
	if m.UnaskedConnects, err = connects(topo.client, nameAddr(names), 300*time.Millisecond); err != nil {
		return m, err
	}
	filtered := mode == modeAgent || mode == modeNft
	if filtered == m.UnaskedConnects {
		if filtered {
			return m, fmt.Errorf("%w: an unasked name's address connects", ErrNotFiltering)
		}
		return m, errors.New("without a filter, an unasked name's address does not connect: the namespaces are broken")
	}
	var queries, conns rrResult
	for i := range names {
		start := time.Now()
		addr, err := query(topo.client, resolver, nameOf(i), 2*time.Second)
		if err != nil {
			return m, err
		}
		queries.latencies = append(queries.latencies, time.Since(start))
		if addr != nameAddr(i) {
			return m, fmt.Errorf("%s answered %s, not %s", nameOf(i), addr, nameAddr(i))
		}
		at, err := startConnect(topo.client, addr, echoPort)
		if err != nil {
			return m, err
		}
		if !at.wait(300 * time.Millisecond) {
			m.FirstDropped++
			if _, err := firstConnect(topo.client, addr, 2*time.Millisecond, 10*time.Second); err != nil {
				return m, fmt.Errorf("%s: %w", nameOf(i), err)
			}
		}
		conns.latencies = append(conns.latencies, time.Since(start))
	}
	m.QueryP50Micros, m.QueryP99Micros = micros(queries.percentile(0.50)), micros(queries.percentile(0.99))
	m.ConnectP50Micro, m.ConnectP99Micro = micros(conns.percentile(0.50)), micros(conns.percentile(0.99))
	return m, nil
}

// addNameAddrs binds n name addresses on the server's device and routes
// them from the router to the server.
//
// Possible errors: an `ip` command's.
func addNameAddrs(topo *topology, n int) error {
	if n > maxNames+2 {
		return fmt.Errorf("at most %d names", maxNames)
	}
	if err := run("ip", "-n", topo.router, "route", "add", namesRoute, "via", serverV4.allowed); err != nil {
		return err
	}
	if err := run("ip", "-n", topo.server, "addr", "add", namesDNSServer+"/24", "dev", nsDev); err != nil {
		return err
	}
	// One `ip -batch` for the n addresses: an `ip` a name takes seconds.
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "addr add %s/32 dev %s\n", nameAddr(i), nsDev)
	}
	cmd := exec.Command("ip", "-n", topo.server, "-batch", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -batch: %w: %s", err, firstLines(string(out), 5))
	}
	return nil
}

// loadNamesRuleset loads the ruleset of the names comparison: as the
// CIDR one's, with a plain set dnsmasq fills instead of the intervals.
//
// Possible errors: nft's.
func loadNamesRuleset(router string) error {
	ruleset := fmt.Sprintf(`table inet %s {
	set names4 {
		type ipv4_addr
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname %q ct state established,related accept
		iifname %q ip daddr @names4 accept
		iifname %q drop
	}
}
`, nftTable, routerClientDev, routerClientDev, routerClientDev)
	cmd := exec.Command("ip", "netns", "exec", router, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %w: %s", err, firstLines(string(out), 5))
	}
	return nil
}

// writeNamesPolicy writes the agent's policy: the names' servers on the
// echo port by name, and DNS to the DNS server for those names only.
//
// Possible errors: writing the file.
func writeNamesPolicy(dir string) error {
	policy := fmt.Sprintf(`name: bpeer-names
egress:
  - toFQDNs: [{matchPattern: "*.%s"}]
    toPorts: [{port: %d, protocol: TCP}]
  - toCIDR: ["%s/32"]
    toPorts: [{port: 53, rules: {dns: [{matchPattern: "*.%s"}]}}]
`, namesDomain, echoPort, namesDNSServer, namesDomain)
	tmp := filepath.Join(dir, ".bpeer-names.tmp")
	if err := os.WriteFile(tmp, []byte(policy), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "bpeer-names.yaml"))
}

// waitNamesEnforced waits until the agent is ready and its DNS proxy
// learns: the warm-up name, asked, lets its address connect.
//
// Possible errors: the agent exited; not within timeout.
func waitNamesEnforced(a *agentRun, client string, warm int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case err := <-a.exited:
			a.exited <- err
			return fmt.Errorf("the agent exited: %v (log: %s)", err, a.log.Name())
		default:
		}
		if ready, status := a.ready(); !ready {
			last = status
			time.Sleep(20 * time.Millisecond)
			continue
		}
		addr, err := query(client, namesDNSServer, nameOf(warm), time.Second)
		if err == nil && addr == nameAddr(warm) {
			// Learned by the proxy, not answered before the policy was in
			// force: the name is in the agent's cache.
			learned, err := a.learned(nameOf(warm))
			if ok, cerr := connects(client, addr, 300*time.Millisecond); learned && cerr == nil && ok {
				return nil
			}
			last = fmt.Sprintf("the warm-up name learned: %t (%v)", learned, err)
		} else {
			last = fmt.Sprintf("the warm-up query: %q, %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the DNS policy not enforced within %s: %s (log: %s)", timeout, last, a.log.Name())
}

// learned reports whether the agent's DNS proxy learned name (the
// shell's fqdn/cache-list).
//
// Possible errors: the shell's.
func (a *agentRun) learned(name string) (bool, error) {
	out, err := exec.Command(a.binary, "fqdn", "cache", "list", "-o", "json", "--shell-sock-path="+a.sock).Output()
	if err != nil {
		return false, err
	}
	var entries []struct{ Name string }
	if err := json.Unmarshal(out, &entries); err != nil {
		return false, err
	}
	return slices.ContainsFunc(entries, func(e struct{ Name string }) bool {
		return strings.TrimSuffix(e.Name, ".") == name
	}), nil
}

// waitResolves waits until the resolver answers the warm-up name.
//
// Possible errors: no answer within timeout.
func waitResolves(client, resolver string, warm int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		addr, err := query(client, resolver, nameOf(warm), 500*time.Millisecond)
		if err == nil && addr == nameAddr(warm) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer %s: %q, %v", resolver, nameOf(warm), addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// query asks server, from the namespace ns over UDP, for name's A record
// and returns the first address answered.
//
// Possible errors: the namespace cannot be entered; no answer within
// timeout; an answer other than NOERROR with an A record.
func query(ns, server, name string, timeout time.Duration) (string, error) {
	var c net.Conn
	if err := netnsrun.Do(ns, func() (err error) {
		c, err = net.Dial("udp", net.JoinHostPort(server, "53"))
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	msg := new(dns.Msg)
	msg.SetQuestion(dns.Fqdn(name), dns.TypeA)
	_ = c.SetDeadline(time.Now().Add(timeout))
	if err := conn.WriteMsg(msg); err != nil {
		return "", err
	}
	reply, err := conn.ReadMsg()
	if err != nil {
		return "", err
	}
	if reply.Rcode != dns.RcodeSuccess {
		return "", fmt.Errorf("%s: %s", name, dns.RcodeToString[reply.Rcode])
	}
	for _, rr := range reply.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String(), nil
		}
	}
	return "", fmt.Errorf("%s: no A record", name)
}

// dnsmasqRun is a dnsmasq in the foreground in a namespace.
type dnsmasqRun struct {
	cmd    *exec.Cmd
	exited chan error
	out    *strings.Builder
}

// startDnsmasq starts dnsmasq in ns, listening on addr only, with no
// configuration file, no /etc/hosts and no upstream from resolv.conf.
//
// Possible errors: dnsmasq cannot be started or exited at once.
func startDnsmasq(ns, addr string, args ...string) (*dnsmasqRun, error) {
	d := &dnsmasqRun{out: &strings.Builder{}}
	d.cmd = exec.Command("ip", append([]string{"netns", "exec", ns, "dnsmasq", "--keep-in-foreground",
		"--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--pid-file=",
		"--bind-interfaces", "--listen-address=" + addr, "--except-interface=lo"}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start dnsmasq: %w", err)
	}
	d.exited = make(chan error, 1)
	go func() { d.exited <- d.cmd.Wait() }()
	select {
	case err := <-d.exited:
		return nil, fmt.Errorf("dnsmasq exited: %v: %s", err, firstLines(d.out.String(), 5))
	case <-time.After(100 * time.Millisecond):
	}
	return d, nil
}

func (d *dnsmasqRun) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}
