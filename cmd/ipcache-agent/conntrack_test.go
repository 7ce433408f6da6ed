// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// ctPolicy enforces both directions: egress allows allowedIP, ingress
// allows only otherIP, so the replies of the endpoint's connections to
// allowedIP pass only because they are tracked.
const ctPolicy = `name: ct
egress:
  - toCIDR: ["` + allowedIP + `/32"]
ingress:
  - fromCIDR: ["` + otherIP + `/32"]
`

const ctTCPPort = "5978"

// ctConn is a TCP connection from the endpoint to an echo server on the
// host side at allowedIP.
type ctConn struct {
	t *testing.T
	c net.Conn
}

func (e *e2e) ctConnect() *ctConn {
	e.t.Helper()
	netnstest.EchoTCP(e.t, e.hostNS, net.JoinHostPort(allowedIP, ctTCPPort))
	var c net.Conn
	require.NoError(e.t, netnstest.InNetns(e.t, e.epNS, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(allowedIP, ctTCPPort), 2*time.Second)
		return err
	}))
	e.t.Cleanup(func() { c.Close() })
	return &ctConn{t: e.t, c: c}
}

// exchange sends msg and waits up to timeout for its echo.
func (c *ctConn) exchange(msg string, timeout time.Duration) error {
	if err := c.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c.c, buf)
	return err
}

// during exchanges a message every 20 ms while fn runs, and fails if one
// is not echoed within a second (an established connection without its
// replies would stall).
func (c *ctConn) during(what string, fn func()) {
	c.t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var n int
	var failed error
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.exchange("data", time.Second); err != nil {
				failed = err
				return
			}
			n++
			time.Sleep(20 * time.Millisecond)
		}
	})
	fn()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	require.NoError(c.t, failed, "%s: exchange %d failed", what, n+1)
	c.t.Logf("%s: %d exchanges", what, n)
	require.Positive(c.t, n)
}

type ctListEntry struct {
	Protocol, Endpoint, Remote, Origin, State string
	ReplySeen                                 bool
	ExpiresIn                                 float64
}

func (e *e2e) ctList() []ctListEntry {
	e.t.Helper()
	var out []ctListEntry
	require.NoError(e.t, json.Unmarshal([]byte(e.shell("conntrack/list", "-o", "json")), &out))
	return out
}

// TestPrivilegedConntrackAcrossRestarts: an established TCP connection,
// whose replies pass only because it is tracked, carries data before,
// during and after an agent restart, across a SIGKILL of the agent and
// while no agent runs; cleanup removes the map.
func TestPrivilegedConntrackAcrossRestarts(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	e.policyFile("ct.yaml", ctPolicy)
	e.startAgent()
	require.Eventually(t, func() bool {
		_, enforced := e.state()
		return enforced[0] && enforced[1] && !e.reachable(otherIP) && e.reachable(allowedIP)
	}, 20*time.Second, 100*time.Millisecond, "policy in force; agent log:\n%s", e.agentLog)

	c := e.ctConnect()
	require.NoError(t, c.exchange("before", time.Second))
	list := e.ctList()
	var found bool
	for _, entry := range list {
		if entry.Protocol == "TCP" && entry.Remote == net.JoinHostPort(allowedIP, ctTCPPort) {
			found = true
			require.Equal(t, "egress", entry.Origin)
			require.Equal(t, "established", entry.State)
			require.True(t, entry.ReplySeen)
			require.Greater(t, entry.ExpiresIn, 5*3600.0)
		}
	}
	require.True(t, found, "connection not in conntrack/list: %v", list)

	// The data's forward packets would track the connection again in a
	// new map: that the map is the same one, entry and all, is what
	// carries the replies of a connection that only receives.
	mapID := func() ebpf.MapID {
		m, err := ebpf.LoadPinnedMap(filepath.Join(e.bpfRoot, "ipcache-agent", "conntrack"), nil)
		require.NoError(t, err)
		defer m.Close()
		info, err := m.Info()
		require.NoError(t, err)
		id, _ := info.ID()
		return id
	}
	id := mapID()
	c.during("restart", func() {
		e.stopAgent()
		time.Sleep(300 * time.Millisecond) // no agent
		e.startAgent()
	})
	c.during("SIGKILL", func() {
		require.NoError(t, e.agent.Process.Signal(syscall.SIGKILL))
		e.agent.Wait()
		e.agent = nil
		time.Sleep(300 * time.Millisecond)
		e.startAgent()
	})
	require.Equal(t, id, mapID(), "conntrack map replaced across restarts")
	require.NoError(t, c.exchange("after", time.Second))

	// A flush forgets the connection; its next forward packet, which
	// policy allows, tracks it again, so its reply still passes.
	require.Regexp(t, `Flushed [1-9]\d* entries`, e.shell("conntrack/flush"))
	require.NoError(t, c.exchange("after flush", time.Second))
	require.NotEmpty(t, e.ctList())

	// Removing the rule that allows allowedIP (egress stays enforced)
	// stops the connection.
	e.policyFile("ct.yaml", "name: ct\negress:\n  - toCIDR: [\""+otherIP+"/32\"]\ningress:\n  - fromCIDR: [\""+otherIP+"/32\"]\n")
	require.Eventually(t, func() bool { return !e.reachable(allowedIP) }, 20*time.Second, 100*time.Millisecond)
	require.Error(t, c.exchange("no rule", time.Second), "data passed without an egress rule")

	e.stopAgent()
	pin := filepath.Join(e.bpfRoot, "ipcache-agent", "conntrack")
	require.FileExists(t, pin)
	_, errOut, code := runAgentCommand(t, "cleanup", "--bpf-root="+e.bpfRoot, "--state-dir="+e.stateDir)
	require.Zero(t, code, errOut)
	_, err := os.Stat(pin)
	require.ErrorIs(t, err, os.ErrNotExist, "conntrack map left after cleanup")
}

// TestPrivilegedConntrackCollection: a restart with another
// --conntrack-map-max-entries migrates the map, entries and all; with the
// test timeout, the agent's job deletes expired entries.
func TestPrivilegedConntrackCollection(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	e.policyFile("ct.yaml", ctPolicy)
	e.extraArgs = []string{"--conntrack-map-max-entries=1024"}
	e.startAgent()
	require.Eventually(t, func() bool {
		_, enforced := e.state()
		return enforced[0] && enforced[1] && e.reachable(allowedIP)
	}, 20*time.Second, 100*time.Millisecond, "policy in force; agent log:\n%s", e.agentLog)
	// entries counts both maps: a ping's echo is one request and one
	// reply, which leaves its entry in ct_opening (its origin does not
	// speak again); conntrack must have maxEntries.
	entries := func(maxEntries uint32) int {
		n := 0
		for _, name := range []string{bpfmaps.ConntrackName, bpfmaps.ConntrackOpeningName} {
			m, err := ebpf.LoadPinnedMap(filepath.Join(e.bpfRoot, "ipcache-agent", name), nil)
			require.NoError(t, err)
			if name == bpfmaps.ConntrackName {
				require.Equal(t, maxEntries, m.MaxEntries())
			}
			var k, v []byte
			it := m.Iterate()
			for it.Next(&k, &v) {
				n++
			}
			require.NoError(t, it.Err())
			m.Close()
		}
		return n
	}
	e.stopAgent()
	// Each ping process has an echo identifier, so an entry, of its own;
	// none has expired yet (60 s).
	before := entries(1024)
	require.Positive(t, before, "the pings are tracked")

	e.extraArgs = []string{"--conntrack-map-max-entries=2048", "--conntrack-test-timeout=1s", "--conntrack-gc-interval=100ms"}
	e.startAgent()
	require.Contains(t, e.agentLog.String(), "Migrating pinned map")
	require.Equal(t, before, entries(2048), "entries lost in the migration")

	require.Regexp(t, `Flushed [1-9]\d* entries`, e.shell("conntrack/flush"))
	require.True(t, e.reachable(allowedIP))
	require.Equal(t, 1, entries(2048))
	require.Eventually(t, func() bool { return entries(2048) == 0 }, 20*time.Second, 100*time.Millisecond,
		"expired entry not collected; agent log:\n%s", e.agentLog)
}

// --conntrack-map-max-entries is a documented flag, checked at start; the
// test flags are hidden.
func TestConntrackFlags(t *testing.T) {
	t.Parallel()
	stdout, _, code := runAgentCommand(t, "--help")
	require.Equal(t, agentcmd.ExitOK, code)
	require.Contains(t, stdout, "--conntrack-map-max-entries uint32")
	require.Contains(t, stdout, "(default 262144)")
	require.NotContains(t, stdout, "conntrack-test-timeout")
	require.NotContains(t, stdout, "conntrack-gc-interval")
	for _, args := range [][]string{
		{"--conntrack-map-max-entries=0"}, {"--conntrack-map-max-entries=lots"}, {"--conntrack-gc-interval=0s"},
	} {
		_, stderr, code := runAgentCommand(t, args...)
		require.Equal(t, agentcmd.ExitUsage, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, strings.SplitN(args[0], "=", 2)[0], "%v", args)
	}
}
