// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/craft"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// More of the endpoints through the real binary: spoofed sources and an
// endpoint file that never stops changing.

// spoofPolicy: web (app=web) may send to allowedIP only; no policy picks
// db, so nothing of db's is enforced and a drop of db's traffic is the
// spoofing check's alone.
var spoofPolicy = fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toCIDR: [%s/32]
`, allowedIP)

// endpointDrops is datapath/counters' count of packets dropped in
// direction for reason.
func (e *endpointsE2E) endpointDrops(direction, reason string) uint64 {
	return (&bypassRig{e2e: e.e2e}).drops(direction, reason)
}

// TestPrivilegedEndpointsSpoofedSource: an endpoint bound to its device is
// only itself there. What db sends from its device with web's address is
// dropped as spoofed-source (counted, and shown by the monitor with db's
// device), although db's traffic is enforced nowhere and web may send
// there; with its own address it passes. The kernel alone would deliver
// the spoofed datagram (the control before any agent), so the drop is the
// program's.
func TestPrivilegedEndpointsSpoofedSource(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	// No reverse-path filter in the host's namespace: the kernel would
	// take web's address from db's device.
	for _, conf := range []string{"all", "default", dbDevice} {
		mustRun(t, "ip", "netns", "exec", e.hostNS, "sysctl", "-qw", "net.ipv4.conf."+conf+".rp_filter=0")
	}
	fromDB := craft.OpenSender(t, e.dbNS, "eth0", craft.HardwareAddr(t, e.hostNS, dbDevice))
	atHost := craft.Listen(t, e.hostNS, unix.AF_INET, unix.IPPROTO_UDP)
	spoofed := func(m []byte) error { return fromDB.SendIP(udp(epAddr, allowedIP, 43001, 7000, m)) }
	own := func(m []byte) error { return fromDB.SendIP(udp(dbAddr, allowedIP, 43002, 7000, m)) }
	control := craft.Marker("spoofed before any agent")
	require.NoError(t, spoofed(control))
	require.True(t, atHost.WaitFor(control, deliveredWithin), "without the agent the host takes web's address from db's device")

	e.endpointFile("eps.yaml", endpointDoc("web", "web", epAddr, e2eDevice)+"---\n"+endpointDoc("db", "db", dbAddr, dbDevice))
	e.policyFile("web.yaml", spoofPolicy)
	e.startAgent()
	e.expect(
		pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
		pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, answered),
	)
	db, ok := e.endpoint("default/db")
	require.True(t, ok)
	require.Equal(t, "none", db.Enforcement.Egress, "nothing of db's is enforced")

	drops := e.startMonitor("drop")
	require.Eventually(t, func() bool {
		require.NoError(t, spoofed(craft.Marker("until the monitor shows it")))
		for _, ev := range drops.events() {
			if ev["reason"] == "spoofed-source" && ev["src"] == epAddr && ev["device"] == dbDevice &&
				ev["direction"] == "egress" && ev["verdict"] == "drop" {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the monitor shows the spoofed datagram's drop: %s\nagent: %s", drops.out, e.agentLog)

	for round := range 3 {
		before := e.endpointDrops("egress", "spoofed-source")
		marker := craft.Marker(fmt.Sprintf("spoofed %d", round))
		require.NoError(t, spoofed(marker))
		require.False(t, atHost.WaitFor(marker, notDeliveredWithin), "round %d: web's address from db's device got through", round)
		require.Greater(t, e.endpointDrops("egress", "spoofed-source"), before,
			"round %d: no spoofed-source drop counted; datapath/counters:\n%s", round, e.shell("datapath/counters"))
		ownMarker := craft.Marker(fmt.Sprintf("own %d", round))
		require.NoError(t, own(ownMarker))
		require.True(t, atHost.WaitFor(ownMarker, deliveredWithin), "round %d: db with its own address is delivered", round)
	}
}

// churnPolicies: web may send to allowedIP, db to otherIP; db2 (what db
// is relabelled to) is picked by no policy.
var churnPolicies = map[string]string{
	"web.yaml": spoofPolicy,
	"db.yaml": fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: db, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: db}}
  egress:
  - toCIDR: [%s/32]
`, otherIP),
}

// churnPhase is how long at least the churned endpoint file is
// rewritten, once a millisecond, with versions of one kind.
const churnPhase = time.Second

// What the agent logs when it registers db (again, relabelled) and when it
// rejects db's file, naming the file, line and column.
var (
	dbRegistered = regexp.MustCompile(`msg="Endpoint registered" module=endpoint endpoint=default/db `)
	dbRejected   = regexp.MustCompile(`msg="Endpoint file rejected[^"]*" module=endpoint file=db\.yaml .*error="db\.yaml:\d+:\d+: `)
)

// churnDoc is db's Endpoint document with labels (YAML flow mapping).
func churnDoc(labels string) string {
	return "apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata:\n  name: db\n  labels: " + labels + "\n" +
		"spec: {addresses: [" + dbAddr + "], interface: " + dbDevice + "}\n"
}

// TestPrivilegedEndpointFileChurn: db's endpoint file is rewritten every
// millisecond for a few seconds: versions with labels of a label set of
// their own each, which the agent takes (db relabelled), then invalid
// ones, which it rejects naming the file, line and column, then the first
// labels again. Meanwhile web, from a file of its own, loses none of its
// 1 ms pings to an address it may reach, and not one datagram it sends to
// an address it may not reach arrives. Afterwards db is enforced by its
// policy again, the agent is healthy, the only label identities are web's
// and db's (none of the versions' is left), and the agent's RSS stayed
// within a bound of what it was before the churn.
func TestPrivilegedEndpointFileChurn(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	e.endpointFile("web.yaml", endpointDoc("web", "web", epAddr, e2eDevice))
	e.endpointFile("db.yaml", endpointDoc("db", "db", dbAddr, dbDevice))
	for name, content := range churnPolicies {
		e.policyFile(name, content)
	}
	deniedDst := netip.MustParseAddrPort(otherIP + ":7003")
	deniedAt := countUDP(t, e.hostNS, deniedDst)
	e.startAgent()
	e.expect(
		pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
		pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, lost),
	)
	pid := e.agent.Process.Pid
	rssBefore := steadyRSS(t, pid)
	resetPeakRSS(t, pid)

	// Every millisecond a new version, atomically (a version written in
	// place is read empty now and then, which only keeps the last good
	// one), in three phases: labels of a label set of their own every
	// time, then invalid YAML, then the first labels. A phase goes on
	// until the agent has read one of its versions (it reads the
	// directory about once a second while the directory keeps changing).
	log := func() string { return e.agentLog.String() }
	registeredBefore := dbRegistered.FindAllStringIndex(log(), -1)
	phases := []struct {
		what    string
		version func(n int) string
		read    func() bool
	}{
		{"labels of their own", func(n int) string { return churnDoc(fmt.Sprintf("{app: db2, version: v%d}", n)) },
			func() bool { return len(dbRegistered.FindAllStringIndex(log(), -1)) > len(registeredBefore) }},
		{"invalid", func(n int) string { return fmt.Sprintf("# version %d\n", n) + churnDoc("{app: db") },
			func() bool { return dbRejected.MatchString(log()) }},
		{"the first labels", func(int) string { return churnDoc("{app: db}") }, func() bool { return true }},
	}
	pinger := netnstest.StartPinger(t, e.epNS, allowedIP, time.Millisecond)
	denied := startUDPStream(t, e.epNS, deniedDst)
	writes := 0
	tick := time.NewTicker(time.Millisecond)
	for _, phase := range phases {
		read := false
		for start := time.Now(); time.Since(start) < churnPhase || !read; writes++ {
			require.Less(t, time.Since(start), 10*time.Second, "the agent read no version %s while the file kept changing; log:\n%s", phase.what, e.agentLog)
			<-tick.C
			e.endpointFile("db.yaml", phase.version(writes))
			if writes%50 == 0 && !read {
				read = phase.read()
			}
		}
	}
	tick.Stop()
	sentDenied := denied.stop()
	sent, replies, longest := pinger.Stop()
	_, peak := procMemory(t, pid)
	t.Logf("%d versions written; web: %d pings, %d answered; %d denied datagrams sent, %d arrived",
		writes, sent, replies, sentDenied, deniedAt.received.Load())
	// Once a millisecond when the machine keeps up; far fewer would
	// still be churn.
	require.Greater(t, writes, 3*int(churnPhase/(20*time.Millisecond)), "versions written")
	require.Greater(t, sent, 3*int(churnPhase/(20*time.Millisecond)), "pings sent")
	require.Equal(t, sent, replies, "web's pings lost during the churn, at most %d in a row, at %s; agent log:\n%s",
		longest, lostAt(pinger), e.agentLog)
	require.Positive(t, sentDenied)
	require.Zero(t, deniedAt.received.Load(), "web's denied datagrams arrived during the churn")

	// db settles on the last version; web is as it was.
	e.expect(
		pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, lost),
		pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
	)
	web, ok := e.endpoint("default/web")
	require.True(t, ok)
	require.Equal(t, "enforced", web.Enforcement.Egress)
	require.Eventually(t, func() bool {
		db, ok := e.endpoint("default/db")
		return ok && db.Enforcement.Egress == "enforced"
	}, 10*time.Second, 50*time.Millisecond, "db's egress enforced again")
	require.Eventually(t, func() bool { return !unhealthy.MatchString(e.health()) }, 10*time.Second, 50*time.Millisecond,
		"the agent is healthy again: %s", e.health())
	var identities []struct{ Identity uint32 }
	out := e.shell("identity/list", "-o", "json")
	require.NoError(t, json.Unmarshal([]byte(out), &identities), out)
	labelIdentities := 0
	for _, id := range identities {
		if id.Identity >= 256 && id.Identity <= 65535 {
			labelIdentities++
		}
	}
	require.Equal(t, 2, labelIdentities, "the label identities are web's and db's: %s", e.shell("identity/list"))
	rssAfter := steadyRSS(t, pid)
	t.Logf("agent RSS: %d MiB before the churn, peak %d MiB during it, %d MiB after", rssBefore>>20, peak>>20, rssAfter>>20)
	require.Less(t, peak-rssBefore, int64(churnPeakOver), "the agent's peak RSS during the churn")
	require.Less(t, rssAfter-rssBefore, int64(churnAfterOver), "the agent's RSS after the churn")
}

// unhealthy matches a module that health does not report OK.
var unhealthy = regexp.MustCompile(`level=(Degraded|Stopped)`)

// The churn's bounds on the agent's RSS over what it was before: generous
// (the race detector's shadow memory included), far below what keeping
// every version written would take.
const (
	churnPeakOver  = 96 << 20
	churnAfterOver = 64 << 20
)
