// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// monitorClient is a running `ipcache-agent monitor -o json`.
type monitorClient struct {
	t   *testing.T
	cmd *exec.Cmd
	out *syncbuf.Buffer
}

func (e *e2e) startMonitor(typ string) *monitorClient {
	e.t.Helper()
	cmd := agentCommand("monitor", "--type="+typ, "-o", "json",
		"--shell-sock-path="+filepath.Join(e.stateDir, "shell.sock"))
	cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0")
	m := &monitorClient{t: e.t, cmd: cmd, out: &syncbuf.Buffer{}}
	cmd.Stdout, cmd.Stderr = m.out, m.out
	require.NoError(e.t, cmd.Start())
	e.t.Cleanup(m.stop)
	return m
}

func (m *monitorClient) stop() {
	if m.cmd.Process == nil || m.cmd.ProcessState != nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGINT)
	_ = m.cmd.Wait()
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

	// A dropped ping appears within a second.
	seen := len(matching(drops.events(), otherIP))
	ping := exec.Command("ip", "netns", "exec", e.epNS, "ping", "-c1", "-W1", otherIP)
	sent := time.Now()
	require.NoError(t, ping.Start())
	require.Eventually(t, func() bool { return len(matching(drops.events(), otherIP)) > seen },
		time.Second, 5*time.Millisecond, "a dropped ping's event within a second: %s", drops.out)
	t.Logf("drop event %v after the ping started", time.Since(sent))
	_ = ping.Wait() // dropped: it fails
	ev := matching(drops.events(), otherIP)[seen]
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
	require.Equal(t, float64(2), ev["identity"], "an address in no policy is world")
	require.Equal(t, []any{"reserved:world"}, ev["labels"])
	when, err := time.Parse(time.RFC3339Nano, ev["time"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, sent, when, time.Second)

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
	require.Empty(t, matching(drops.events(), allowedIP), "no allowed packet with --type drop")
	for _, ev := range verdicts.events() {
		require.Equal(t, "allow", ev["verdict"], "--type verdict shows allowed packets only")
	}

	// The text form answers too.
	text := agentCommand("shell", "--shell-sock-path="+filepath.Join(e.stateDir, "shell.sock"), "help", "monitor")
	out, err := text.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--type")
}
