// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// Connection tracking under a SYN flood, through the real
// agent binary on bypass_test.go's network. New connections' entries are
// made in ct_opening (LRU) and move to conntrack (a hash that never evicts)
// once the origin speaks after a reply, so a flood of SYNs from spoofed
// sources churns ct_opening only. The connections here are opened by the
// peer to the endpoint's port floodPort, which ingress allows; egress is
// enforced and does not allow the peer, so every packet the endpoint sends
// on them passes only as a reply: without its entry, the connection stops.

const floodPort = 8080

// floodPolicy allows TCP to floodPort from the peer's allowed networks;
// egress allows only an address the test never talks to.
const floodPolicy = `name: flood
egress:
  - toCIDR: ["` + allowedIP + `/32"]
ingress:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 8080, protocol: TCP}]
`

// peerConn is a TCP connection the peer (from its allowed address) opened
// to the endpoint. The peer's side echoes what it reads; the test talks on
// the endpoint's side, so each exchange starts with a packet the endpoint
// sends, which passes only as a reply.
type peerConn struct {
	ep, peer net.Conn
	// peerPort is the peer's port: the entry's remote.
	peerPort int
}

// floodListener is the endpoint's listener on floodPort, both families.
func (b *bypassRig) floodListener(t *testing.T) net.Listener {
	var l net.Listener
	require.NoError(t, netnstest.InNetns(t, b.epNS, func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", floodPort))
		return err
	}))
	t.Cleanup(func() { l.Close() })
	return l
}

// connectFromPeer opens a connection from the peer's address from (an
// allowed one) to the endpoint's address to, accepted by l.
func (b *bypassRig) connectFromPeer(t *testing.T, l net.Listener, from, to string) *peerConn {
	t.Helper()
	var peer net.Conn
	require.NoError(t, netnstest.InNetns(t, b.peerNS, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		peer, err = d.Dial("tcp", net.JoinHostPort(to, strconv.Itoa(floodPort)))
		return err
	}), "connect from %s to %s", from, to)
	ep, err := l.Accept()
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(peer, peer) })
	t.Cleanup(func() { ep.Close(); peer.Close(); wg.Wait() })
	return &peerConn{ep: ep, peer: peer, peerPort: peer.LocalAddr().(*net.TCPAddr).Port}
}

// exchange sends msg from the endpoint and waits up to timeout for the
// peer's echo; it returns how long that took.
func (c *peerConn) exchange(msg string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := c.ep.SetDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := c.ep.Write([]byte(msg)); err != nil {
		return 0, err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c.ep, buf); err != nil {
		return time.Since(start), err
	}
	if string(buf) != msg {
		return time.Since(start), fmt.Errorf("echo %q, want %q", buf, msg)
	}
	return time.Since(start), nil
}

// stallLimit is the longest an exchange may take: on a veth it takes well
// under a millisecond, and a dropped segment costs TCP at least 200 ms
// (its minimum retransmission timeout) per try.
const stallLimit = time.Second

// exchanging keeps a connection exchanging a message every 10 ms, each
// bounded by stallLimit, until stopped.
type exchanging struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	n       int
	slowest time.Duration
	err     error
}

func (c *peerConn) keepExchanging() *exchanging {
	x := &exchanging{stop: make(chan struct{})}
	x.wg.Go(func() {
		for {
			select {
			case <-x.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			took, err := c.exchange(fmt.Sprintf("exchange %d", x.n), stallLimit)
			x.slowest = max(x.slowest, took)
			if err != nil {
				x.err = fmt.Errorf("exchange %d (after %v): %w", x.n+1, took, err)
				return
			}
			x.n++
		}
	})
	return x
}

// end stops the exchanges and returns how many succeeded, the slowest, and
// the first failure.
func (x *exchanging) end() (int, time.Duration, error) {
	close(x.stop)
	x.wg.Wait()
	return x.n, x.slowest, x.err
}

// floodCTEntry is an entry of conntrack/list -o json.
type floodCTEntry struct {
	Protocol, Endpoint, Remote, Origin, State, Map string
	ReplySeen                                      bool
}

func (b *bypassRig) ctEntries() []floodCTEntry {
	b.t.Helper()
	var out []floodCTEntry
	list := b.shell("conntrack/list", "-o", "json")
	require.NoError(b.t, json.Unmarshal([]byte(list), &out), "conntrack/list: %.2000s", list)
	return out
}

// ctEntryOf finds the entry of c (from the peer's address from to the
// endpoint's to), nil if there is none.
func ctEntryOf(entries []floodCTEntry, c *peerConn, from, to string) *floodCTEntry {
	for i, e := range entries {
		if e.Protocol == "TCP" && e.Remote == net.JoinHostPort(from, strconv.Itoa(c.peerPort)) &&
			e.Endpoint == net.JoinHostPort(to, strconv.Itoa(floodPort)) {
			return &entries[i]
		}
	}
	return nil
}

// pinnedEntries counts the entries of the pinned map name and returns its
// max entries.
func (b *bypassRig) pinnedEntries(name string) (n int, maxEntries uint32) {
	b.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(b.bpfRoot), name), nil)
	require.NoError(b.t, err)
	defer m.Close()
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	require.NoError(b.t, it.Err())
	return n, m.MaxEntries()
}

var metricsAddress = regexp.MustCompile(`Serving Prometheus metrics.*?address"?[=:]"?([^"\s]+)`)

// metric reads the sample of the metric name (without labels) from the
// agent's /metrics, served on the host side's loopback (the agent runs in
// the host side's namespace): -1 if it is not there.
func (b *bypassRig) metric(name string) float64 {
	b.t.Helper()
	m := metricsAddress.FindStringSubmatch(b.agentLog.String())
	require.NotNil(b.t, m, "the agent logs where it serves metrics: %s", b.agentLog)
	var c net.Conn
	require.NoError(b.t, netnstest.InNetns(b.t, b.hostNS, func() (err error) {
		c, err = net.DialTimeout("tcp", m[1], 2*time.Second)
		return err
	}))
	defer c.Close()
	require.NoError(b.t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", m[1])
	require.NoError(b.t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	require.Equal(b.t, http.StatusOK, resp.StatusCode, "%s", body)
	sample := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if sample == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(sample[1]), 64)
	require.NoError(b.t, err)
	return v
}

// conntrackGCHealth is the health row of the conntrack-gc job.
func (b *bypassRig) conntrackGCHealth() (level, errText string) {
	b.t.Helper()
	var rows []struct{ Scope, Level, Message, Error string }
	out := b.health("-o", "json")
	require.NoError(b.t, json.Unmarshal([]byte(out), &rows), "health -o json: %s", out)
	for _, r := range rows {
		if strings.Contains(r.Scope, "conntrack-gc") {
			return r.Level, r.Error
		}
	}
	require.FailNow(b.t, "no conntrack-gc job in health", "%s", out)
	return "", ""
}

// floodSyn is the i-th SYN of the flood: from an address of the allowed
// 10.20.0.0/16 that is not the peer's (10.20.1.1 and up) and a port of its
// own, to the endpoint's floodPort.
func floodSyn(i int) []byte {
	src := fmt.Sprintf("10.20.%d.%d", 1+i/250, 1+i%250)
	return syn(src, epAddr, uint16(10000+i%50000), floodPort, nil)
}

// TestPrivilegedSynFlood: an established connection keeps flowing through a
// SYN flood of twenty times ct_opening's size from spoofed sources that
// policy allows, and one that is idle during the flood works after it;
// both are in the conntrack map afterwards, and nothing was counted as a
// failed move to it.
func TestPrivilegedSynFlood(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	const openingMax = 1024
	const syns = 20 * openingMax
	b.scenario(t, b.agentArgs[0], fmt.Sprintf("--conntrack-opening-map-max-entries=%d", openingMax),
		"--conntrack-gc-interval=200ms", "--prometheus-serve-addr=127.0.0.1:0")
	b.usePolicies(map[string]string{"flood.yaml": floodPolicy})
	l := b.floodListener(t)

	busy := b.connectFromPeer(t, l, peerAllowed4, epAddr)
	idle := b.connectFromPeer(t, l, peerAllowed4, epAddr)
	evicted := b.connectFromPeer(t, l, peerAllowed4, epAddr)
	for _, c := range []*peerConn{busy, idle, evicted} {
		_, err := c.exchange("before the flood", stallLimit)
		require.NoError(t, err)
	}
	entries := b.ctEntries()
	for _, c := range []*peerConn{busy, idle} {
		e := ctEntryOf(entries, c, peerAllowed4, epAddr)
		require.NotNil(t, e, "connection from port %d not tracked: %v\nagent log:\n%s", c.peerPort, entries, b.agentLog)
		require.Equal(t, "conntrack", e.Map, "an established connection is in the conntrack map")
		require.Equal(t, "ingress", e.Origin)
	}
	// The control: what an eviction does to an idle connection. Its entry
	// is deleted from the pinned map, as a single LRU map would have
	// evicted it in the flood.
	b.deleteCTEntry(evicted.peerPort)
	allowedBefore := b.allowed("ingress")

	// The flood, paced so that the veths' backlogs (1000 packets) take
	// it: a burst of 100 SYNs, then a millisecond's pause. It lasts a
	// second or more, longer than TCP's first retransmission timeouts, so
	// that a connection whose entry it evicted would stall past
	// stallLimit (below).
	x := busy.keepExchanging()
	start := time.Now()
	for i := range syns {
		if err := b.fromPeer.SendIP(floodSyn(i)); err != nil {
			require.NoError(t, err, "SYN %d", i)
		}
		if i%100 == 99 {
			time.Sleep(time.Millisecond)
		}
	}
	floodTook := time.Since(start)
	time.Sleep(300 * time.Millisecond) // exchanges after the flood too
	n, slowest, err := x.end()
	allowedSyns := b.allowed("ingress") - allowedBefore
	t.Logf("flood: %d SYNs sent in %v, %d ingress packets allowed meanwhile; busy connection: %d exchanges, the slowest %v",
		syns, floodTook, allowedSyns, n, slowest)

	// What would catch a single map: the SYNs' entries churn ct_opening
	// twenty times over. Were an established connection's entry in that
	// LRU with them, the idle one's would be evicted; its next packet from
	// the endpoint, which egress policy does not allow, would then be
	// dropped (no-policy) and retransmitted in vain while the peer, waiting
	// for it, sends nothing that could track the connection again: the
	// exchange below would stall and fail, as the control's does (its
	// entry deleted before the flood, as an eviction would). The busy one is kept by its own
	// traffic as long as the flood inserts fewer than ct_opening's size
	// between two of its packets; it checks that nothing in the flood's
	// path (the program, the map writes, the agent's collection rounds)
	// stops or slows an established connection.
	require.NoError(t, err, "the busy connection, during the flood")
	assert.Greater(t, n, 50, "the busy connection exchanged little during the flood")
	assert.Less(t, slowest, stallLimit)
	took, err := idle.exchange("after the flood", stallLimit)
	require.NoError(t, err, "the connection idle during the flood, after it (%v)", took)
	// The control shows that this exchange fails when the entry is gone:
	// the endpoint's segment is dropped and retransmitted in vain.
	_, err = evicted.exchange("after the flood", stallLimit)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(),
		"the control connection, without its entry: %v (want a timeout: else the exchange above shows nothing)", err)
	_, err = busy.exchange("after the flood", stallLimit)
	require.NoError(t, err, "the busy connection, after the flood")
	// The flood went through the program, allowed, at ten times
	// ct_opening's size at least (some may be lost on the veths).
	require.GreaterOrEqual(t, allowedSyns, uint64(10*openingMax), "the flood did not reach the program")

	entries = b.ctEntries()
	opening := 0
	for _, e := range entries {
		if e.Map == "ct_opening" {
			opening++
		}
	}
	for _, c := range []*peerConn{busy, idle} {
		e := ctEntryOf(entries, c, peerAllowed4, epAddr)
		require.NotNil(t, e, "connection from port %d no longer tracked after the flood", c.peerPort)
		assert.Equal(t, "conntrack", e.Map, "connection from port %d", c.peerPort)
		assert.Equal(t, "established", e.State)
	}
	pinned, pinnedMax := b.pinnedEntries(bpfmaps.ConntrackOpeningName)
	t.Logf("after the flood: %d entries listed in ct_opening, %d in the pinned map (max %d)", opening, pinned, pinnedMax)
	require.Equal(t, uint32(openingMax), pinnedMax)
	assert.LessOrEqual(t, opening, openingMax)
	assert.LessOrEqual(t, pinned, openingMax)
	// The flood filled it (an LRU map evicts before it is quite full).
	assert.GreaterOrEqual(t, opening, openingMax/2, "the flood did not fill ct_opening")

	assert.Equal(t, 0.0, b.metric("ipcache_agent_conntrack_full_total"))
	level, errText := b.conntrackGCHealth()
	assert.NotEqual(t, "Degraded", level, "conntrack-gc: %s", errText)
}

// deleteCTEntry deletes the entry of the TCP connection from the peer's
// port from the pinned conntrack map.
func (b *bypassRig) deleteCTEntry(peerPort int) {
	b.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(b.bpfRoot), bpfmaps.ConntrackName), nil)
	require.NoError(b.t, err)
	defer m.Close()
	var k bpfmaps.ConntrackKey
	var v bpfmaps.ConntrackValue
	var found []bpfmaps.ConntrackKey
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, remote, proto, err := k.Fields(); err == nil && proto == 6 && int(remote.Port()) == peerPort {
			found = append(found, k)
		}
	}
	require.NoError(b.t, it.Err())
	require.Len(b.t, found, 1, "conntrack entries of the connection from port %d", peerPort)
	require.NoError(b.t, m.Delete(found[0]))
}

// allowed is datapath/counters' count of allowed packets in direction.
func (b *bypassRig) allowed(direction string) uint64 {
	b.t.Helper()
	var counters map[string]struct {
		Allowed uint64 `json:"allowed"`
	}
	out := b.shell("datapath/counters", "-o", "json")
	require.NoError(b.t, json.Unmarshal([]byte(out), &counters), "datapath/counters -o json: %s", out)
	return counters[direction].Allowed
}

// TestPrivilegedConntrackFull: with room for 4 established connections,
// 6 are opened; all keep working (the last two stay in ct_opening), the
// failed moves are counted in conntrack_full_total, and the conntrack-gc
// job is Degraded saying the map is full.
func TestPrivilegedConntrackFull(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	const ctMax, conns = 4, 6
	b.scenario(t, b.agentArgs[0], fmt.Sprintf("--conntrack-map-max-entries=%d", ctMax),
		"--conntrack-gc-interval=200ms", "--prometheus-serve-addr=127.0.0.1:0")
	b.usePolicies(map[string]string{"flood.yaml": floodPolicy})
	require.Equal(t, 0.0, b.metric("ipcache_agent_conntrack_full_total"))
	l := b.floodListener(t)

	type conn struct {
		*peerConn
		from, to string
	}
	var cs []conn
	for i := range conns {
		from, to := peerAllowed4, epAddr
		if i%2 == 1 {
			from, to = peerAllowed6, epAddr6
		}
		c := b.connectFromPeer(t, l, from, to)
		_, err := c.exchange("first", stallLimit)
		require.NoError(t, err, "connection %d", i)
		cs = append(cs, conn{c, from, to})
	}
	var xs []*exchanging
	for _, c := range cs {
		xs = append(xs, c.keepExchanging())
	}

	full := func() float64 { return b.metric("ipcache_agent_conntrack_full_total") }
	require.Eventually(t, func() bool { return full() > 0 }, 10*time.Second, 100*time.Millisecond,
		"conntrack_full_total stays 0 with %d connections and room for %d", conns, ctMax)
	var level, errText string
	require.Eventually(t, func() bool {
		level, errText = b.conntrackGCHealth()
		return level == "Degraded" && strings.HasPrefix(errText, "the conntrack map is full")
	}, 10*time.Second, 100*time.Millisecond, "conntrack-gc not Degraded: level %q, error %q", level, errText)
	t.Logf("conntrack-gc: %s: %s", level, errText)
	assert.Contains(t, errText, "--conntrack-map-max-entries")

	entries := b.ctEntries()
	where := map[string]int{}
	for i, c := range cs {
		e := ctEntryOf(entries, c.peerConn, c.from, c.to)
		require.NotNil(t, e, "connection %d not tracked: %v", i, entries)
		assert.Equal(t, "established", e.State, "connection %d", i)
		where[e.Map]++
	}
	assert.Equal(t, map[string]int{"conntrack": ctMax, "ct_opening": conns - ctMax}, where)
	n, maxEntries := b.pinnedEntries(bpfmaps.ConntrackName)
	assert.Equal(t, uint32(ctMax), maxEntries)
	assert.Equal(t, ctMax, n)

	time.Sleep(300 * time.Millisecond)
	for i, x := range xs {
		n, slowest, err := x.end()
		t.Logf("connection %d (%s): %d exchanges, the slowest %v", i, cs[i].from, n, slowest)
		assert.NoError(t, err, "connection %d", i)
		assert.Positive(t, n, "connection %d", i)
	}
	assert.Greater(t, full(), 0.0)
}
