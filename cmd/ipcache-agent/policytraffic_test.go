// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Deny, port ranges, ICMP types, enableDefaultDeny and --enable-policy
// through the real binary (docs/CONTRACT.md, "Semantics" and "Policy file
// formats"): policy files in the formats people already have, and
// connections, datagrams and pings from the endpoint through the
// enforcement program. One agent serves every scenario that runs with the
// same flags; a scenario replaces the policy directory's content and
// waits until the agent holds exactly its files in force.

// probeTimeout bounds a TCP connect or a UDP datagram's arrival. A SYN
// the program drops is retransmitted after a second, so a dropped connect
// times out rather than being refused, while an allowed one on the veth
// is answered at once.
const probeTimeout = 500 * time.Millisecond

// The endpoint's IPv6 address and the host side's, on the veth.
const (
	epAddr6       = "fd00:201::2"
	hostSideAddr6 = "fd00:201::1"
)

// What a probe saw.
const (
	connected = "connected"
	timedOut  = "timed out"
	delivered = "delivered"
	answered  = "answered"
	lost      = "lost"
)

// probe is one piece of traffic and what it must see.
type probe struct {
	what string
	run  func() string
	want string
}

// tcpProbe connects from the endpoint to addr (an EchoTCP server) and
// echoes a byte: connected, timed out, or the error (a refused connection
// is neither a pass nor a policy drop).
func (e *e2e) tcpProbe(addr string, want string) probe { return tcpFrom(e.t, e.epNS, "", addr, want) }

// tcpFrom is tcpProbe from the namespace ns, with the source address src
// ("": the one the namespace's route gives).
func tcpFrom(t *testing.T, ns, src, addr string, want string) probe {
	return probe{what: "TCP " + addr, want: want, run: func() string {
		d := net.Dialer{Timeout: probeTimeout}
		if src != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
		}
		var c net.Conn
		err := netnstest.InNetns(t, ns, func() (err error) {
			c, err = d.Dial("tcp", addr)
			return err
		})
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return timedOut
		}
		if err != nil {
			return err.Error()
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
			return err.Error()
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return "connected, write: " + err.Error()
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			return "connected, no echo: " + err.Error()
		}
		return connected
	}}
}

// echoTCP serves TCP echo on every port at addr in the host side's
// namespace, for the running subtest.
func (e *e2e) echoTCP(addr string, ports ...int) {
	for _, port := range ports {
		netnstest.EchoTCP(e.t, e.hostNS, net.JoinHostPort(addr, fmt.Sprint(port)))
	}
}

// udpSink is a UDP socket on the host side that the endpoint's datagrams
// are to reach.
type udpSink struct {
	conn net.PacketConn
	addr string
	seq  int
}

func (e *e2e) udpSink(addr string) *udpSink {
	e.t.Helper()
	s := &udpSink{addr: addr}
	require.NoError(e.t, netnstest.InNetns(e.t, e.hostNS, func() (err error) {
		s.conn, err = net.ListenPacket("udp", addr)
		return err
	}))
	e.t.Cleanup(func() { s.conn.Close() })
	return s
}

// udpProbe sends a datagram from the endpoint to the sink: delivered if
// it arrives within probeTimeout, else lost. Each datagram says which it
// is, so a late one of an earlier round is not taken for this one's.
func (e *e2e) udpProbe(s *udpSink, want string) probe {
	return probe{what: "UDP " + s.addr, want: want, run: func() string {
		s.seq++
		msg := fmt.Sprintf("probe %d", s.seq)
		err := netnstest.InNetns(e.t, e.epNS, func() error {
			c, err := net.Dial("udp", s.addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(msg))
			return err
		})
		if err != nil {
			return "send: " + err.Error()
		}
		if err := s.conn.SetReadDeadline(time.Now().Add(probeTimeout)); err != nil {
			return err.Error()
		}
		buf := make([]byte, 64)
		for {
			n, _, err := s.conn.ReadFrom(buf)
			if err != nil {
				return lost
			}
			if string(buf[:n]) == msg {
				return delivered
			}
		}
	}}
}

// pingProbe pings to from the namespace from once.
func pingProbe(from, to, want string) probe {
	return probe{what: "ping " + to, want: want, run: func() string {
		if pingsFrom(from, to) {
			return answered
		}
		return lost
	}}
}

// expect runs every probe until all see what they want in one round, for
// at most ten seconds (the enforcement map and the program follow the
// tables a moment later), and fails with what each saw last.
func (e *e2e) expect(probes ...probe) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for round := 1; ; round++ {
		var report strings.Builder
		ok := true
		for _, p := range probes {
			got := p.run()
			mark := "ok"
			if got != p.want {
				ok, mark = false, "WRONG"
			}
			fmt.Fprintf(&report, "  %-5s %-28s want %-9s got %s\n", mark, p.what, p.want, got)
		}
		if ok {
			e.t.Logf("round %d:\n%s", round, &report)
			return
		}
		if time.Now().After(deadline) {
			require.FailNow(e.t, "traffic not as the policy says",
				"after %d rounds:\n%sagent log:\n%s", round, &report, e.agentLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// usePolicies makes files (name -> content) the policy directory's whole
// content and waits until the agent lists exactly them, all in force and
// all written to the policy map, and the enforcement map switched as they
// say. A rejected file fails at once with the agent's reason.
func (e *e2e) usePolicies(files map[string]string) {
	e.t.Helper()
	dir, err := os.ReadDir(e.policyDir)
	require.NoError(e.t, err)
	for _, f := range dir {
		if _, keep := files[f.Name()]; !keep && !strings.HasPrefix(f.Name(), ".") {
			e.removePolicyFile(f.Name())
		}
	}
	for name, content := range files {
		e.policyFile(name, content)
	}
	want := slices.Sorted(maps.Keys(files))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var list []struct {
			File, Status, Error string
			NotWritten          int
		}
		out := e.shell("policy/list", "-o", "json")
		require.NoError(e.t, json.Unmarshal([]byte(out), &list), "policy/list: %s", out)
		var inForce []string
		for _, f := range list {
			name := filepath.Base(f.File)
			if _, mine := files[name]; mine && f.Status == "rejected" {
				require.FailNow(e.t, "policy file rejected", "%s: %s", name, f.Error)
			}
			if f.Status == "in force" && f.NotWritten == 0 {
				inForce = append(inForce, name)
			}
		}
		slices.Sort(inForce)
		if slices.Equal(want, inForce) && len(list) == len(want) && e.policyMapIsTable() && e.enforcementWritten() {
			return
		}
		if time.Now().After(deadline) {
			require.FailNow(e.t, "policy files not in force", "want %v; policy/list: %s\nagent log:\n%s", want, out, e.agentLog)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// enforcementWritten reports whether the enforcement map is switched as
// every `policy-enforcement` row says: the writer switches a direction on
// only after the policy map has its entries, so a connection opened once
// the policy map is written may still find its direction off, pass
// untracked, and have its replies dropped once the direction is on.
func (e *e2e) enforcementWritten() bool {
	out := e.shell("db/show", "--format=json", policy.EnforcementTableName)
	// One JSON object per row.
	dec := json.NewDecoder(strings.NewReader(out))
	rows := 0
	for ; ; rows++ {
		var row struct{ Status reconciler.Status }
		err := dec.Decode(&row)
		if errors.Is(err, io.EOF) {
			return rows > 0
		}
		require.NoError(e.t, err, "db/show %s: %s", policy.EnforcementTableName, out)
		if row.Status.Kind != reconciler.StatusKindDone {
			return false
		}
	}
}

// policyMapIsTable reports whether the pinned policy map holds exactly
// the `policy` table's entries. bpf/policy --diff fails while they
// differ, with the differences on stdout: a poll's "not yet".
func (e *e2e) policyMapIsTable() bool {
	var diff struct{ Total int }
	out, err := e.tryShell("bpf/policy", "--diff", "-o", "json")
	require.NoError(e.t, json.Unmarshal([]byte(out), &diff), "bpf/policy --diff: %s (%v)", out, err)
	if diff.Total == 0 {
		require.NoError(e.t, err, "bpf/policy --diff with no difference")
		return true
	}
	require.ErrorContains(e.t, err, "differences from the desired table", "bpf/policy --diff with %d differences", diff.Total)
	return false
}

// runAgentWith makes the running agent one started with args: restarted
// if it runs with other flags, started if none runs.
func (e *e2e) runAgentWith(args ...string) {
	e.t.Helper()
	if e.agent != nil && slices.Equal(e.extraArgs, args) {
		return
	}
	e.stopAgent()
	e.extraArgs = args
	e.startAgent()
}

// scenario points e at the subtest t (its failures, its servers'
// cleanups), and back at the parent when t ends, and has an agent run with
// agentArgs for it.
func (e *e2e) scenario(t *testing.T, agentArgs ...string) {
	parent := e.t
	e.t = t
	t.Cleanup(func() { e.t = parent })
	e.runAgentWith(agentArgs...)
}

// cnp is a CiliumNetworkPolicy in namespace e2e with spec.
func cnp(name, spec string) string {
	return "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: " + name +
		"\n  namespace: e2e\nspec:\n  endpointSelector: {}\n" + spec
}

// denyAll denies everything both ways, for every peer.
var denyAll = cnp("deny-all", `  egressDeny:
    - toEntities: [all]
  ingressDeny:
    - fromEntities: [all]
`)

func TestPrivilegedPolicyTraffic(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", hostSideAddr6+"/64", "dev", e2eDevice, "nodad")
	mustRun(t, "ip", "-n", e.epNS, "addr", "add", epAddr6+"/64", "dev", "eth0", "nodad")
	require.Eventually(t, func() bool { return pingsFrom(e.epNS, hostSideAddr6) }, 10*time.Second, 50*time.Millisecond,
		"the endpoint reaches %s before any agent runs", hostSideAddr6)
	x, other := allowedIP, otherIP
	hostPort := func(addr string, port int) string { return net.JoinHostPort(addr, fmt.Sprint(port)) }

	// --enable-policy=always: both directions default deny without a
	// single policy.
	t.Run("enable-policy=always without policies drops both ways", func(t *testing.T) {
		e.scenario(t, "--enable-policy=always")
		e.usePolicies(nil)
		e.expect(pingProbe(e.epNS, x, lost), pingProbe(e.hostNS, epAddr, lost))
	})

	// --enable-policy=never: a policy that denies everything is read and
	// written to the policy map, and nothing is enforced. The same file
	// in the default mode drops both ways: what passed is the flag's doing.
	t.Run("enable-policy=never with deny-all passes both ways", func(t *testing.T) {
		e.scenario(t, "--enable-policy=never")
		e.usePolicies(map[string]string{"deny-all.yaml": denyAll})
		e.expect(pingProbe(e.epNS, x, answered), pingProbe(e.hostNS, epAddr, answered))
		verdicts := e.pinnedPolicy()
		require.NotEmpty(t, verdicts, "the policy map keeps the entries")
		for key, verdict := range verdicts {
			require.Equal(t, uint32(2), verdict, "entry %x: deny (2)", key)
		}

		e.runAgentWith()
		e.usePolicies(map[string]string{"deny-all.yaml": denyAll})
		e.expect(pingProbe(e.epNS, x, lost), pingProbe(e.hostNS, epAddr, lost))
	})

	// An L3 deny of x wins over an allow of x's TCP port (narrower: the
	// longest-prefix match alone would find the allow); the same allow of
	// the other address, not denied, lets its connection through. The
	// monitor shows the drop as policy-deny, naming the deny's policy.
	t.Run("L3 deny beats a narrower port allow", func(t *testing.T) {
		e.scenario(t)
		e.echoTCP(x, 7001)
		e.echoTCP(other, 7001)
		drops := e.startMonitor("drop")
		e.usePolicies(map[string]string{"l3-deny.yaml": cnp("l3-deny", `  egress:
    - toCIDR: ["`+x+`/32", "`+other+`/32"]
      toPorts: [{ports: [{port: "7001", protocol: TCP}]}]
  egressDeny:
    - toCIDR: ["`+x+`/32"]
`)})
		e.expect(e.tcpProbe(hostPort(x, 7001), timedOut), e.tcpProbe(hostPort(other, 7001), connected))

		var denied map[string]any
		require.Eventually(t, func() bool {
			e.tcpProbe(hostPort(x, 7001), timedOut).run()
			for _, ev := range drops.events() {
				if ev["dst"] == x && ev["dport"] == float64(7001) {
					denied = ev
					return true
				}
			}
			return false
		}, 10*time.Second, 10*time.Millisecond, "monitor --type drop shows the denied SYN: %s", drops.out)
		require.Equal(t, "drop", denied["verdict"])
		require.Equal(t, "egress", denied["direction"])
		require.Equal(t, "policy-deny", denied["reason"], "a deny entry dropped it, not default deny")
		require.Equal(t, "e2e/l3-deny", denied["policy"], "the policy of the deny entry")
	})

	// A deny of x's TCP port 8080 wins over an L3 allow of x (broader):
	// x's other port and ICMP pass; the other address, in no allow rule,
	// is dropped by default deny. Native format.
	t.Run("port deny beats a broader L3 allow", func(t *testing.T) {
		e.scenario(t)
		e.echoTCP(x, 8080, 8081)
		e.echoTCP(other, 8081)
		e.usePolicies(map[string]string{"port-deny.yaml": `name: port-deny
egress:
  - toCIDR: ["` + x + `/32"]
egressDeny:
  - toCIDR: ["` + x + `/32"]
    toPorts: [{port: 8080, protocol: TCP}]
`})
		e.expect(e.tcpProbe(hostPort(x, 8080), timedOut), e.tcpProbe(hostPort(x, 8081), connected),
			pingProbe(e.epNS, x, answered), e.tcpProbe(hostPort(other, 8081), timedOut))
	})

	// A NetworkPolicy port range 8000-8009, TCP and UDP: its first and
	// last ports (in different aligned blocks: 8000-8007 and 8008-8009)
	// pass, the ports on either side of it do not.
	t.Run("endPort range first last and one past", func(t *testing.T) {
		e.scenario(t)
		ports := []int{7999, 8000, 8009, 8010}
		e.echoTCP(x, ports...)
		sinks := map[int]*udpSink{}
		for _, port := range ports {
			sinks[port] = e.udpSink(hostPort(x, port))
		}
		e.usePolicies(map[string]string{"range.yaml": `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: range, namespace: e2e}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
    - to: [{ipBlock: {cidr: "` + x + `/32"}}]
      ports:
        - {port: 8000, endPort: 8009, protocol: TCP}
        - {port: 8000, endPort: 8009, protocol: UDP}
`})
		e.expect(
			e.tcpProbe(hostPort(x, 7999), timedOut), e.tcpProbe(hostPort(x, 8000), connected),
			e.tcpProbe(hostPort(x, 8009), connected), e.tcpProbe(hostPort(x, 8010), timedOut),
			e.udpProbe(sinks[7999], lost), e.udpProbe(sinks[8000], delivered),
			e.udpProbe(sinks[8009], delivered), e.udpProbe(sinks[8010], lost))
	})

	// An ICMP type rule (echo request: IPv4 type 8, IPv6 type 128) lets
	// pings through and nothing else to the same addresses; a rule of
	// another type (timestamp, 13) does not let pings through: the type
	// is matched, not just the protocol.
	t.Run("ICMP echo request type rule", func(t *testing.T) {
		e.scenario(t)
		e.echoTCP(x, 7001)
		e.echoTCP(hostSideAddr6, 7001)
		e.usePolicies(map[string]string{"icmp.yaml": cnp("icmp", `  egress:
    - toCIDR: ["`+x+`/32", "`+hostSideAddr6+`/128"]
      icmps: [{fields: [{type: 8, family: IPv4}, {type: 128, family: IPv6}]}]
    - toCIDR: ["`+other+`/32"]
      icmps: [{fields: [{type: 13, family: IPv4}]}]
`)})
		e.expect(pingProbe(e.epNS, x, answered), e.tcpProbe(hostPort(x, 7001), timedOut),
			pingProbe(e.epNS, hostSideAddr6, answered), e.tcpProbe(hostPort(hostSideAddr6, 7001), timedOut),
			pingProbe(e.epNS, other, lost))
	})

	// enableDefaultDeny {egress: false} and only a deny rule: the denied
	// port is dropped and everything else passes (no default deny).
	// Native format.
	t.Run("enableDefaultDeny egress false with only a deny", func(t *testing.T) {
		e.scenario(t)
		e.echoTCP(x, 8080, 8081)
		e.echoTCP(other, 8080)
		e.usePolicies(map[string]string{"deny-only.yaml": `name: deny-only
enableDefaultDeny: {egress: false}
egressDeny:
  - toCIDR: ["` + x + `/32"]
    toPorts: [{port: 8080, protocol: TCP}]
`})
		e.expect(e.tcpProbe(hostPort(x, 8080), timedOut), e.tcpProbe(hostPort(x, 8081), connected),
			pingProbe(e.epNS, x, answered), e.tcpProbe(hostPort(other, 8080), connected),
			pingProbe(e.epNS, other, answered))
	})
}

// TestPrivilegedDenyFullPolicyMap: with the policy map full, a new deny of
// one TCP port of an allowed address cannot be written; the port does not
// pass (docs/FAULTS.md, "Full maps": the deny guard writes deny over the
// address identity's allow until the deny is in). Before, the allow took
// the port's packets and the connection went through.
func TestPrivilegedDenyFullPolicyMap(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	x, other := allowedIP, otherIP
	hostPort := func(addr string, port int) string { return net.JoinHostPort(addr, fmt.Sprint(port)) }
	e.scenario(t, "--policy-map-max-entries=2")
	// x and other are addresses of the agent's namespace: the node cell
	// gives them identities of their own. A policy in force before the
	// node cell has spoken has its entries for their cidr identities
	// first, then for those: a change of identity, made before broken,
	// needs room for both in a map of two, and never gets it (CI, once).
	require.Eventually(t, func() bool {
		pinned, err := bpfmaps.ReadIPCache(e.bpfRoot)
		_, hasX := pinned[netip.MustParsePrefix(x+"/32")]
		_, hasOther := pinned[netip.MustParsePrefix(other+"/32")]
		return err == nil && hasX && hasOther
	}, 10*time.Second, 20*time.Millisecond, "the agent's own addresses in the ipcache map")
	e.echoTCP(x, 7022, 7080)
	e.echoTCP(other, 7022)
	allow := `name: allow
egress:
  - toCIDR: ["` + x + `/32", "` + other + `/32"]
`
	e.usePolicies(map[string]string{"allow.yaml": allow})
	e.expect(e.tcpProbe(hostPort(x, 7022), connected), e.tcpProbe(hostPort(x, 7080), connected),
		e.tcpProbe(hostPort(other, 7022), connected))

	// The map holds the two allows; the deny does not fit.
	e.policyFile("deny.yaml", `name: deny
egressDeny:
  - toCIDR: ["`+x+`/32"]
    toPorts: [{port: 7022, protocol: TCP}]
`)
	require.Eventually(t, func() bool {
		var list []struct {
			File       string
			NotWritten int
		}
		require.NoError(t, json.Unmarshal([]byte(e.shell("policy/list", "-o", "json")), &list))
		for _, f := range list {
			if filepath.Base(f.File) == "deny.yaml" && f.NotWritten == 1 {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the deny entry is in force and not in the full policy map")
	// x's denied port does not pass (nor, while the deny is out, its other
	// port: the guard denies x's identity); the other address is untouched.
	e.expect(e.tcpProbe(hostPort(x, 7022), timedOut), e.tcpProbe(hostPort(x, 7080), timedOut),
		e.tcpProbe(hostPort(other, 7022), connected))
	// It stays so (the writer retries the deny meanwhile).
	time.Sleep(time.Second)
	e.expect(e.tcpProbe(hostPort(x, 7022), timedOut), e.tcpProbe(hostPort(other, 7022), connected))

	// Room appears: the allow of other goes. The deny is written, then x's
	// allow is back: only the denied port is dropped.
	e.usePolicies(map[string]string{"allow.yaml": `name: allow
egress:
  - toCIDR: ["` + x + `/32"]
`, "deny.yaml": `name: deny
egressDeny:
  - toCIDR: ["` + x + `/32"]
    toPorts: [{port: 7022, protocol: TCP}]
`})
	e.expect(e.tcpProbe(hostPort(x, 7022), timedOut), e.tcpProbe(hostPort(x, 7080), connected))
}
