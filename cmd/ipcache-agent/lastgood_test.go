// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The last good policy through the real binary (docs/ARCHITECTURE.md
// "Last good policy", docs/CONTRACT.md "Policy
// files"): what the operator's mistakes and an editor's save do to the
// pinned maps and to traffic through the enforcement program.

// allowedOnly allows allowedIP and not otherIP: a /31 rather than a /32, so
// that the policy's prefix is not the pinged address itself.
const allowedOnly = "10.201.1.0/31"

// keeperFile keeps egress enforced whatever happens to the other files, so
// that a policy that wrongly goes away shows as dropped probes rather than
// as enforcement switched off (which lets everything through).
const keeperFile = "keeper.yaml"

var keeperPolicy = "name: keeper\negress:\n  - toCIDR: [\"10.9.0.0/16\"]\n"

// pinned is everything the enforcement program decides with. Prefixes
// are strings so that a failure's diff is readable.
type pinned struct {
	ipcache  map[string]uint32
	policy   map[bpfmaps.PolicyKey]uint32
	enforced [2]bool
}

func (e *e2e) pinned() pinned {
	e.t.Helper()
	ipcache, enforced := e.state()
	p := pinned{ipcache: map[string]uint32{}, policy: e.pinnedPolicy(), enforced: enforced}
	for prefix, id := range ipcache {
		p.ipcache[prefix.String()] = id
	}
	return p
}

// waitReleased waits until the restore handle was released: the grace
// period is over and whatever restore alone kept alive is gone.
func (e *e2e) waitReleased() {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return strings.Contains(e.shell("restore/status"), "Released: true") },
		20*time.Second, 100*time.Millisecond, "restore not released; agent log:\n%s", e.agentLog)
	// What the release removes reaches the pinned maps through the
	// reconcilers a moment later: give a wrong removal time to show.
	time.Sleep(500 * time.Millisecond)
}

// waitRead waits until the agent has read the policy directory once.
func (e *e2e) waitRead() {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return strings.Contains(e.agentLog.String(), "Policy directory read") },
		10*time.Second, 10*time.Millisecond, "policy directory not read; agent log:\n%s", e.agentLog)
}

// probing is a pinger that the test stops, or its cleanup does (before the
// namespaces go) when the test fails first.
type probing struct {
	*netnstest.Pinger
	stopped bool
}

// startProbing pings to from the endpoint every millisecond.
func (e *e2e) startProbing(to string) *probing {
	p := &probing{Pinger: netnstest.StartPinger(e.t, e.epNS, to, time.Millisecond)}
	e.t.Cleanup(func() {
		if !p.stopped {
			p.Stop()
		}
	})
	// Answers from the first probes on: the path is warm.
	time.Sleep(100 * time.Millisecond)
	return p
}

// requireNoLoss stops the pinger once it sent more than atLeast probes
// and fails unless every probe was answered. On a loaded machine the
// pinger's ticks come late: it then probes the state after the change a
// little longer rather than the test failing for too few probes.
func (e *e2e) requireNoLoss(what string, pinger *probing, atLeast int) {
	e.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); pinger.Sent() <= atLeast && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	pinger.stopped = true
	sent, answered, longest := pinger.Stop()
	e.t.Logf("%s: %d probes, %d answered", what, sent, answered)
	require.Greater(e.t, sent, atLeast, "%s: too few probes to tell", what)
	require.Equal(e.t, sent, answered, "%s: probes lost, at most %d in a row, sent at %s; agent log:\n%s",
		what, longest, lostAt(pinger.Pinger), e.agentLog)
}

// TestPrivilegedTypoThenRestart: the only egress policy allows
// allowedIP; while the agent is down its file gets a typo. After the
// restart, and past the restore grace period, the pinned maps are what
// they were: the previous version stays in force, allowedIP passes,
// otherIP is dropped, and a ping every millisecond across the restart
// loses nothing.
func TestPrivilegedTypoThenRestart(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	good := "name: e2e\negress:\n  - toCIDR: [\"" + allowedOnly + "\"]\n"
	e.policyFile(policyFile, good)
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)
	before := e.pinned()
	require.Contains(t, before.ipcache, allowedOnly)
	require.True(t, before.enforced[policy.Egress], "egress enforced")

	pinger := e.startProbing(allowedIP)
	e.stopAgent()
	// An unknown field: the whole file is invalid.
	e.policyFile(policyFile, strings.Replace(good, "toCIDR", "toCDIR", 1))
	e.startAgent()
	e.waitRead()
	e.waitReleased()
	e.requireNoLoss("across the restart with a typo", pinger, 500)
	require.Equal(t, before, e.pinned(), "the pinned maps past the grace period")
	require.True(t, e.reachable(allowedIP), "%s still allowed", allowedIP)
	require.False(t, e.reachable(otherIP), "%s still dropped", otherIP)

	// What the operator is told.
	require.Contains(t, e.agentLog.String(), `msg="Policy file rejected, its version in force before the restart stays in force"`)
	list := e.shell("policy/list")
	require.Regexp(t, `allow.yaml +rejected +e2e \(allow.yaml:1\)\n +allow.yaml:3:5: invalid policy file: .*toCDIR`, list)
}

// TestPrivilegedContestedNameRestart: z.yaml holds policy x;
// a.yaml, later and first by name, declares x too and is rejected. After a
// restart with both files unchanged z.yaml still holds x: its prefix stays
// in the pinned ipcache past the grace period and a.yaml's never gets
// there, so allowedIP keeps passing (not one probe lost) and otherIP stays
// dropped.
func TestPrivilegedContestedNameRestart(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	e.policyFile("z.yaml", "name: x\negress:\n  - toCIDR: [\""+allowedOnly+"\"]\n")
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)
	// a.yaml's x would allow otherIP instead of allowedIP.
	e.policyFile("a.yaml", "name: x\negress:\n  - toCIDR: [\""+otherIP+"/32\"]\n")
	contested := regexp.MustCompile(`a.yaml +rejected +\n +a.yaml:1: policy name already in use: policy "x" is in force from z.yaml`)
	require.Eventually(t, func() bool { return contested.MatchString(e.shell("policy/list")) },
		10*time.Second, 50*time.Millisecond, "a.yaml rejected; agent log:\n%s", e.agentLog)
	before := e.pinned()
	require.Contains(t, before.ipcache, allowedOnly)
	// otherIP is an address of the agent's namespace (a host address, in
	// the ipcache whatever the policies): no policy of a.yaml owns it.
	require.NotContains(t, e.shell("ipcache/lookup", otherIP), "policy/x")

	pinger := e.startProbing(allowedIP)
	e.stopAgent()
	e.startAgent()
	e.waitRead()
	e.waitReleased()
	e.requireNoLoss("across the restart with a contested name", pinger, 500)
	after := e.pinned()
	require.Contains(t, after.ipcache, allowedOnly, "z.yaml's prefix past the grace period")
	require.Equal(t, before, after, "the pinned maps past the grace period")
	require.True(t, e.reachable(allowedIP), "%s still allowed", allowedIP)
	require.False(t, e.reachable(otherIP), "%s still dropped", otherIP)

	list := e.shell("policy/list")
	require.Regexp(t, contested, list)
	require.Regexp(t, `z.yaml +in force +x \(z.yaml:1\)`, list)
}

// TestPrivilegedEditorSave: an editor saves a policy file in
// place: it truncates it, and writes it again 300 ms later (longer than
// the watcher's 100 ms debounce, so the agent reads the empty file). A
// ping every millisecond through the enforcement program to the address
// the file allows loses nothing, round after round, and the file's prefix
// keeps its identity number. Another policy keeps egress enforced, so
// that the file's rules going away would drop probes.
func TestPrivilegedEditorSave(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	content := []byte("name: e2e\negress:\n  - toCIDR: [\"" + allowedOnly + "\"]\n")
	path := filepath.Join(e.policyDir, policyFile)
	e.policyFile(keeperFile, keeperPolicy)
	e.policyFile(policyFile, string(content))
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)
	before := e.pinned()
	require.Contains(t, before.ipcache, allowedOnly)

	// Every read that changes what the agent says of the file is logged
	// once, so a new log line about it after the truncation tells that the
	// agent has read the empty file.
	aboutFile := func() int { return e.logLines("file=" + policyFile) }
	againInForce := regexp.MustCompile(`allow.yaml +in force +e2e \(allow.yaml:1\)`)
	const rounds = 5
	for round := range rounds {
		pinger := e.startProbing(allowedIP)
		seen := aboutFile()
		truncated := time.Now()
		// Editors truncate either way: truncate(2) or open(O_TRUNC).
		if round%2 == 0 {
			require.NoError(t, os.Truncate(path, 0))
		} else {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
		require.Eventually(t, func() bool { return aboutFile() > seen }, 10*time.Second, 5*time.Millisecond,
			"round %d: the agent did not read the empty file; agent log:\n%s", round, e.agentLog)
		emptyRead := time.Now()
		// On a busy machine the shell may stretch the 300 ms: the file
		// then stays empty longer, which proves no less.
		// The read is logged before policy/list shows its status: poll
		// until then, while the file is still empty.
		rejectedWhileEmpty := regexp.MustCompile(`allow.yaml +rejected +e2e \(allow.yaml:1\)\n +allow.yaml: no policies in the file`)
		whileEmpty := e.shell("policy/list")
		for !rejectedWhileEmpty.MatchString(whileEmpty) && time.Now().Before(truncated.Add(250*time.Millisecond)) {
			time.Sleep(5 * time.Millisecond)
			whileEmpty = e.shell("policy/list")
		}
		time.Sleep(time.Until(truncated.Add(300 * time.Millisecond)))
		// Written in place: the same inode, as an editor that does not
		// write a temporary file and rename it.
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.Write(content)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		wrote := time.Now()
		// Content equal to the version in force is in force again without
		// a log line; the shell says so once the debounced read is done.
		time.Sleep(200 * time.Millisecond)
		require.Eventually(t, func() bool { return againInForce.MatchString(e.shell("policy/list")) },
			10*time.Second, 20*time.Millisecond, "round %d: in force again; agent log:\n%s", round, e.agentLog)
		t.Logf("round %d: empty read after %s, written after %s, in force again after %s", round,
			emptyRead.Sub(truncated).Round(time.Millisecond), wrote.Sub(truncated).Round(time.Millisecond),
			time.Since(truncated).Round(time.Millisecond))
		time.Sleep(200 * time.Millisecond)
		e.requireNoLoss(fmt.Sprintf("round %d: truncated, then written", round), pinger, 300)
		require.Equal(t, before, e.pinned(), "round %d: same pinned maps, same identity numbers", round)
		require.Regexp(t, rejectedWhileEmpty, whileEmpty,
			"round %d: while empty, rejected and still in force", round)
		require.Equal(t, round+1, e.logLines(`msg="Policy file rejected, its previous version stays in force"`,
			"file="+policyFile, "no policies in the file"), "round %d: the rejection of the empty file is logged", round)
	}
	require.False(t, e.reachable(otherIP), "%s still dropped", otherIP)
}

// logLines counts the agent's log lines that contain all of parts.
func (e *e2e) logLines(parts ...string) int {
	n := 0
lines:
	for _, line := range strings.Split(e.agentLog.String(), "\n") {
		for _, part := range parts {
			if !strings.Contains(line, part) {
				continue lines
			}
		}
		n++
	}
	return n
}
