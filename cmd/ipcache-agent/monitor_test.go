// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// monitorClient is a running `ipcache-agent monitor -o json`.
type monitorClient struct {
	t   *testing.T
	cmd *exec.Cmd
	out *syncbuf.Buffer
}

func (e *e2e) startMonitor(typ string, filters ...string) *monitorClient {
	e.t.Helper()
	cmd := agentCommand(append([]string{"monitor", "--type=" + typ, "-o", "json",
		"--shell-sock-path=" + filepath.Join(e.stateDir, "shell.sock")}, filters...)...)
	cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0")
	m := &monitorClient{t: e.t, cmd: cmd, out: &syncbuf.Buffer{}}
	cmd.Stdout, cmd.Stderr = m.out, m.out
	require.NoError(e.t, cmd.Start())
	e.t.Cleanup(m.stop)
	return m
}

// stop stops the client with SIGTERM, its default effect, which SIGINT
// would not have if the tests were started with it ignored (as a shell
// starts a background job: the client inherits it, and an in-process hive
// gives the test process back that disposition when it stops). One still
// running 10 s later fails the test and is killed, rather than hold the
// package's tests until their timeout.
func (m *monitorClient) stop() {
	if m.cmd.Process == nil || m.cmd.ProcessState != nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan struct{})
	go func() { _ = m.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		m.t.Errorf("monitor client still running 10 s after SIGTERM: %s", m.out)
		m.cmd.Process.Kill()
		<-exited
	}
}

// events parses every line so far; a line that is not a JSON object fails.
func (m *monitorClient) events() []map[string]any {
	m.t.Helper()
	var events []map[string]any
	for line := range strings.Lines(m.out.String()) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var ev map[string]any
		require.NoError(m.t, json.Unmarshal([]byte(line), &ev), "monitor line %q", line)
		events = append(events, ev)
	}
	return events
}

// matching returns the events to dst of an ICMP echo request.
func matching(events []map[string]any, dst string) []map[string]any {
	var out []map[string]any
	for _, ev := range events {
		if ev["dst"] == dst && ev["protocol"] == "ICMP" && ev["type"] == float64(8) {
			out = append(out, ev)
		}
	}
	return out
}

func TestPrivilegedMonitor(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	e.writePolicy(allowedIP)
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)

	drops := e.startMonitor("drop")
	verdicts := e.startMonitor("verdict")
	// Subscribed once a dropped ping shows.
	require.Eventually(t, func() bool {
		e.reachable(otherIP)
		return len(matching(drops.events(), otherIP)) > 0
	}, 10*time.Second, 10*time.Millisecond, "monitor --type drop shows no drop: %s\nagent: %s", drops.out, e.agentLog)

	// A dropped ping's event is shown within a second of its packet. The
	// event's time is the packet's (the kernel's clock); the ping's own
	// start is not counted, which a loaded machine (CI's, running tests
	// under the race detector beside lint) can take a second over.
	ping := exec.Command("ip", "netns", "exec", e.epNS, "ping", "-c1", "-W1", otherIP)
	sent := time.Now()
	require.NoError(t, ping.Start())
	var (
		ev    map[string]any
		when  time.Time
		shown time.Time
	)
	require.Eventually(t, func() bool {
		for _, m := range matching(drops.events(), otherIP) {
			at, err := time.Parse(time.RFC3339Nano, m["time"].(string))
			// This ping's packet, not a late event of reachable's (an
			// event without a time is never this one: the wait fails).
			if err == nil && !at.Before(sent.Add(-50*time.Millisecond)) {
				ev, when, shown = m, at, time.Now()
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "a dropped ping's event: %s", drops.out)
	t.Logf("drop event shown %v after its packet, %v after the ping started", shown.Sub(when), shown.Sub(sent))
	require.WithinDuration(t, when, shown, time.Second, "the event is shown within a second of its packet: %v", ev)
	_ = ping.Wait() // dropped: it fails
	keys := make([]string, 0, len(ev))
	for k := range ev {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	require.Equal(t, []string{"device", "direction", "dst", "identity", "labels", "protocol", "reason", "src", "time", "type", "verdict"}, keys)
	require.Equal(t, "10.201.0.2", ev["src"])
	require.Equal(t, "egress", ev["direction"])
	require.Equal(t, e2eDevice, ev["device"])
	require.Equal(t, "drop", ev["verdict"])
	require.Equal(t, "no-policy", ev["reason"])
	// otherIP is an address of the agent's namespace: a host address,
	// whose identity is its own with the host entity's label, not world.
	require.NotEqual(t, float64(2), ev["identity"], "an address of this node is not world")
	require.Equal(t, []any{"cidr:" + otherIP + "/32", "reserved:host"}, ev["labels"])

	// An allowed ping: with --type verdict, with its policy's identity and
	// labels; not with --type drop.
	require.True(t, e.reachable(allowedIP))
	require.Eventually(t, func() bool { return len(matching(verdicts.events(), allowedIP)) > 0 },
		time.Second, 5*time.Millisecond, "an allowed ping's event with --type verdict: %s", verdicts.out)
	allowed := matching(verdicts.events(), allowedIP)[0]
	require.Equal(t, "allow", allowed["verdict"])
	require.Contains(t, []any{"policy", "established"}, allowed["reason"])
	require.NotEqual(t, float64(2), allowed["identity"], "the allowed address has a CIDR identity")
	require.Contains(t, allowed["labels"], "cidr:"+allowedIP+"/32")
	if allowed["reason"] == "policy" {
		require.Equal(t, "e2e", allowed["policy"], "the policy that allowed it")
		require.Equal(t, []any{"e2e:egress[0]"}, allowed["rules"], "the rule that allowed it")
	}
	require.Empty(t, matching(drops.events(), allowedIP), "no allowed packet with --type drop")
	for _, ev := range verdicts.events() {
		require.Equal(t, "allow", ev["verdict"], "--type verdict shows allowed packets only")
	}

	// Filtered as hubble observe: drops for lack of policy to
	// 10.201.1.0/30 (otherIP's), not those to outsideIP. The shell serves
	// two monitors at once: the verdicts' leaves first.
	verdicts.stop()
	var filtered *monitorClient
	require.Eventually(t, func() bool {
		filtered = e.startMonitor("drop", "--to-ip", "10.201.1.0/30", "--verdict", "no-policy")
		time.Sleep(300 * time.Millisecond)
		if strings.Contains(filtered.out.String(), "shell busy") {
			filtered.stop()
			return false
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the verdicts' monitor leaves")
	require.Eventually(t, func() bool {
		e.reachable(otherIP)
		return len(matching(filtered.events(), otherIP)) > 0
	}, 10*time.Second, 10*time.Millisecond, "monitor --to-ip --verdict shows no drop: %s", filtered.out)
	// The filtered client now has every event the other has: a drop to
	// outsideIP (shown unfiltered), then one to otherIP, that it shows.
	const outsideIP = "10.202.0.9"
	filteredSeen := len(matching(filtered.events(), otherIP))
	require.False(t, e.reachable(outsideIP))
	require.Eventually(t, func() bool {
		e.reachable(otherIP)
		return len(matching(drops.events(), outsideIP)) > 0 && len(matching(filtered.events(), otherIP)) > filteredSeen
	}, 10*time.Second, 10*time.Millisecond, "monitor shows the drop to %s: %s\nfiltered: %s", outsideIP, drops.out, filtered.out)
	require.Equal(t, "no-policy", matching(drops.events(), outsideIP)[0]["reason"])
	require.Empty(t, matching(filtered.events(), outsideIP), "--to-ip 10.201.1.0/30 filters out the drop to %s", outsideIP)
	for _, ev := range filtered.events() {
		require.Equal(t, otherIP, ev["dst"], "only drops to 10.201.1.0/30 (no allowed packet, no other destination)")
		require.Equal(t, "no-policy", ev["reason"])
	}

	// The text names the policy and rule that allowed a packet; without
	// --type, --verdict policy asks for verdict events.
	filtered.stop()
	var textOut *syncbuf.Buffer
	var textClient *monitorClient
	require.Eventually(t, func() bool {
		text := agentCommand("monitor", "--verdict", "policy", "--to-ip", allowedIP, "--shell-sock-path="+filepath.Join(e.stateDir, "shell.sock"))
		text.Env = append(text.Env, "GORACE=atexit_sleep_ms=0")
		textOut = &syncbuf.Buffer{}
		text.Stdout, text.Stderr = textOut, textOut
		require.NoError(t, text.Start())
		textClient = &monitorClient{t: t, cmd: text, out: textOut}
		t.Cleanup(textClient.stop)
		time.Sleep(300 * time.Millisecond)
		if strings.Contains(textOut.String(), "shell busy") {
			textClient.stop()
			return false
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the filtered monitor leaves")
	require.Eventually(t, func() bool {
		// A new ping's echo request is a new flow: decided by policy.
		e.reachable(allowedIP)
		return strings.Contains(textOut.String(), " -> "+allowedIP+" ICMP type 8; policy e2e, rule e2e:egress[0]\n")
	}, 10*time.Second, 10*time.Millisecond, "monitor --verdict policy names the rule: %s", textOut)
	require.NotContains(t, textOut.String(), "drop", "--verdict policy shows allowed packets only")

	// The text form answers too.
	text := agentCommand("shell", "--shell-sock-path="+filepath.Join(e.stateDir, "shell.sock"), "help", "monitor")
	out, err := text.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--type")
}

// cpuTime is a process's user and system time so far (/proc/<pid>/stat).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	// Fields after the command's parenthesis: state is the 3rd field,
	// utime the 14th and stime the 15th.
	_, rest, ok := strings.Cut(string(stat), ") ")
	require.True(t, ok)
	fields := strings.Fields(rest)
	utime, err := strconv.ParseUint(fields[11], 10, 64)
	require.NoError(t, err)
	stime, err := strconv.ParseUint(fields[12], 10, 64)
	require.NoError(t, err)
	const ticksPerSecond = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

var pingRTT = regexp.MustCompile(`rtt min/avg/max/mdev = [\d.]+/([\d.]+)/`)

// pingFor pings dst from the endpoint every millisecond for d and returns
// sent, received and the average round trip.
func (e *e2e) pingFor(dst string, d time.Duration) (sent, received int, avg float64) {
	e.t.Helper()
	out, _ := exec.Command("ip", "netns", "exec", e.epNS, "ping", "-q", "-i", "0.001", "-w", strconv.Itoa(int(d.Seconds())), dst).CombinedOutput()
	m := pingSummary.FindStringSubmatch(string(out))
	require.NotNil(e.t, m, "ping: %s", out)
	sent, _ = strconv.Atoi(m[1])
	received, _ = strconv.Atoi(m[2])
	if r := pingRTT.FindStringSubmatch(string(out)); r != nil {
		avg, _ = strconv.ParseFloat(r[1], 64)
	}
	return sent, received, avg
}

// flood sends UDP datagrams from the endpoint to dst:9 at about pps
// until stop is closed, and returns how many it sent.
func (e *e2e) flood(dst string, pps int, stop <-chan struct{}) int {
	var conn *net.UDPConn
	require.NoError(e.t, netnstest.InNetns(e.t, e.epNS, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: 9})
		conn = c
		return err
	}))
	defer conn.Close()
	payload := make([]byte, 16)
	sent := 0
	const tick = time.Millisecond
	perTick := pps / int(time.Second/tick)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return sent
		case <-ticker.C:
		}
		for range perTick {
			if _, err := conn.Write(payload); err == nil {
				sent++
			}
		}
	}
}

// TestPrivilegedMonitorFlood does not run in parallel with the other tests:
// the flood is sent by the test process, at a rate it does not keep with
// the other tests' agents on the same two cores.
func TestPrivilegedMonitorFlood(t *testing.T) {
	e := newE2E(t)
	e.writePolicy(allowedIP)
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)

	_, _, calm := e.pingFor(allowedIP, time.Second)
	all := e.startMonitor("all")
	require.Eventually(t, func() bool {
		e.reachable(otherIP)
		return len(matching(all.events(), otherIP)) > 0
	}, 10*time.Second, 10*time.Millisecond, "monitor shows no drop: %s", all.out)
	lostBefore := e.eventsLost()
	seenBefore := len(all.events())

	pid := e.agent.Process.Pid
	cpuBefore := cpuTime(t, pid)
	const floodFor = 3 * time.Second
	stop := make(chan struct{})
	floodSent := make(chan int)
	start := time.Now()
	go func() { floodSent <- e.flood(otherIP, 100_000, stop) }()
	sent, received, busy := e.pingFor(allowedIP, floodFor)
	close(stop)
	flooded := <-floodSent
	elapsed := time.Since(start)
	cpu := cpuTime(t, pid) - cpuBefore
	time.Sleep(500 * time.Millisecond) // the last events reach the client
	events := len(all.events()) - seenBefore
	lost := e.eventsLost() - lostBefore

	t.Logf("flood: %d datagrams in %v (%.0f/s); events shown %d, lost %d; agent CPU %v; ping 1 ms: %d sent, %d received, avg rtt %.3f ms (%.3f ms without the flood)",
		flooded, elapsed, float64(flooded)/elapsed.Seconds(), events, lost, cpu, sent, received, busy, calm)
	// Per CPU and second at most 1000 events (bpf/enforce.c), one window
	// more for the windows' edges.
	limit := 1000 * runtime.NumCPU() * (int(elapsed.Seconds()) + 2)
	require.LessOrEqual(t, events, limit, "events are rate-limited")
	// The sender is bound by its own writes (one syscall a datagram,
	// race-built): about 30,000 a second on a busy CI machine, not the
	// 100,000 asked. Five times the limit still floods it.
	require.Greater(t, flooded, 5*limit, "the flood ran, well past the events' limit")
	require.Positive(t, lost, "lost events are counted")
	require.Less(t, cpu, elapsed/2, "the agent's CPU stays bounded during the flood")
	require.Equal(t, sent, received, "the allowed ping loses nothing")
	require.Less(t, busy, calm*10+1, "forwarding is not slowed much (ms)")
}

// eventsLost is datapath/events-lost's total.
func (e *e2e) eventsLost() uint64 {
	e.t.Helper()
	var lost struct{ RateLimit, RingFull uint64 }
	require.NoError(e.t, json.Unmarshal([]byte(e.shell("datapath/events-lost", "-o", "json")), &lost))
	return lost.RateLimit + lost.RingFull
}

// TestPrivilegedMonitorNamesEndpoint: with endpoints, an event names the
// local endpoint whose policy decided (JSON endpointName, the text's
// "endpoint <namespace>/<name>"), and policy/explain --endpoint reads that
// endpoint's policy map.
func TestPrivilegedMonitorNamesEndpoint(t *testing.T) {
	t.Parallel()
	e := newEndpointsE2E(t)
	e.endpointFile("eps.yaml", endpointDoc("web", "web", epAddr, e2eDevice)+"---\n"+endpointDoc("db", "db", dbAddr, dbDevice))
	e.policyFile("web.yaml", fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toCIDR: [%s/32]
`, allowedIP))
	e.policyFile("db.yaml", fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: db, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: db}}
  egress:
  - toCIDR: [%s/32]
`, otherIP))
	e.startAgent()
	e.expect(pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost),
		pingProbe(e.dbNS, otherIP, answered), pingProbe(e.dbNS, allowedIP, lost))
	web, _ := e.endpoint("default/web")
	db, _ := e.endpoint("default/db")

	drops := e.startMonitor("drop")
	text := agentCommand("monitor", "--type=drop", "--shell-sock-path="+filepath.Join(e.stateDir, "shell.sock"))
	text.Env = append(text.Env, "GORACE=atexit_sleep_ms=0")
	textOut := &syncbuf.Buffer{}
	text.Stdout, text.Stderr = textOut, textOut
	require.NoError(t, text.Start())
	t.Cleanup((&monitorClient{t: t, cmd: text, out: textOut}).stop)

	// web's ping to otherIP and db's to allowedIP are dropped, each by its
	// own endpoint's policy.
	require.Eventually(t, func() bool {
		e.reachable(otherIP)
		pingsFrom(e.dbNS, allowedIP)
		return len(matching(drops.events(), otherIP)) > 0 && len(matching(drops.events(), allowedIP)) > 0 &&
			strings.Contains(textOut.String(), "endpoint default/db")
	}, 10*time.Second, 10*time.Millisecond, "monitor shows both endpoints' drops: %s\ntext: %s", drops.out, textOut)
	webDrop := matching(drops.events(), otherIP)[0]
	require.Equal(t, "default/web", webDrop["endpointName"])
	require.Equal(t, float64(web.Identity), webDrop["endpoint"])
	require.Equal(t, epAddr, webDrop["src"])
	dbDrop := matching(drops.events(), allowedIP)[0]
	require.Equal(t, "default/db", dbDrop["endpointName"])
	require.Equal(t, float64(db.Identity), dbDrop["endpoint"])
	require.Contains(t, textOut.String(), fmt.Sprintf("egress, endpoint default/web (identity %d), identity ", web.Identity))

	// Filtered by endpoint and by a label of its identity: db's drops,
	// not web's. The shell serves two monitors at once: the text's leaves.
	(&monitorClient{t: t, cmd: text, out: textOut}).stop()
	var dbOnly *monitorClient
	require.Eventually(t, func() bool {
		dbOnly = e.startMonitor("drop", "--endpoint", "default/db", "--label", "k8s:app=db")
		time.Sleep(300 * time.Millisecond)
		if strings.Contains(dbOnly.out.String(), "shell busy") {
			dbOnly.stop()
			return false
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the text monitor leaves")
	require.Eventually(t, func() bool {
		pingsFrom(e.dbNS, allowedIP)
		return len(matching(dbOnly.events(), allowedIP)) > 0
	}, 10*time.Second, 10*time.Millisecond, "monitor --endpoint default/db shows db's drop: %s", dbOnly.out)
	// web's drop, then db's: the filtered client had both, shows db's.
	webSeen, dbSeen := len(matching(drops.events(), otherIP)), len(matching(dbOnly.events(), allowedIP))
	require.Eventually(t, func() bool {
		e.reachable(otherIP)
		pingsFrom(e.dbNS, allowedIP)
		return len(matching(drops.events(), otherIP)) > webSeen && len(matching(dbOnly.events(), allowedIP)) > dbSeen
	}, 10*time.Second, 10*time.Millisecond, "web's drop unfiltered, db's filtered: %s\nfiltered: %s", drops.out, dbOnly.out)
	for _, ev := range dbOnly.events() {
		require.Equal(t, "default/db", ev["endpointName"], "--endpoint default/db shows db's events only")
	}

	// policy/explain reads each endpoint's policy map: the same peer,
	// two verdicts.
	out := e.shell("policy/explain", "--endpoint", "default/web", otherIP, "egress")
	require.Regexp(t, fmt.Sprintf(`(?m)^Maps: %s subject %d, .*no policy map entry allows it: drop$`, regexp.QuoteMeta(epAddr), web.Identity), out)
	out = e.shell("policy/explain", "--endpoint", "default/db", otherIP, "egress")
	require.Regexp(t, fmt.Sprintf(`(?m)^Maps: %s subject %d, .*policy map entry .*: allow$`, regexp.QuoteMeta(dbAddr), db.Identity), out)
}

// A filter's invalid value is an error naming the flag, before the agent
// is asked (no agent runs here: its socket does not exist).
func TestMonitorInvalidFilter(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "shell.sock")
	for _, args := range [][]string{
		{"--to-ip", "10.0.0.0/33"},
		{"--verdict", "denied"},
		{"--protocol", "gre"},
		{"--label", "app=web"},
		{"--endpoint", "web"},
	} {
		stdout, stderr, code := runAgentCommand(t, append([]string{"monitor", "--shell-sock-path=" + sock}, args...)...)
		require.NotZero(t, code, "%v", args)
		require.Empty(t, stdout)
		require.Contains(t, stderr, args[0]+` "`+args[1]+`": invalid filter`, "%v", args)
		require.NotContains(t, stderr, sock, "%v: refused before the agent is asked", args)
	}
}

// --type dns is the DNS proxy's events: accepted, the agent is asked; an
// unknown type is an error before it is.
func TestMonitorType(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "shell.sock")
	_, stderr, code := runAgentCommand(t, "monitor", "--type=dns", "--shell-sock-path="+sock)
	require.NotZero(t, code, "no agent runs")
	require.Contains(t, stderr, sock, "--type dns: the agent is asked")
	_, stderr, code = runAgentCommand(t, "monitor", "--type=dnss", "--shell-sock-path="+sock)
	require.NotZero(t, code)
	require.Contains(t, stderr, "--type dnss: want drop, verdict, dns or all")
	require.NotContains(t, stderr, sock)
}
