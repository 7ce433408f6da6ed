// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// previousLayoutCommit is the last commit whose agent pins the previous
// map layout: `policy` one flat LPM trie (the host-wide default's only)
// and `enforcement` an array of the two directions.
const previousLayoutCommit = "f128708135b6e9a5fe461d765ef0f1397c68dcd5"

// buildPreviousAgent builds the agent of previousLayoutCommit from the
// repository's history (a fresh clone has it) and returns its path.
func buildPreviousAgent(t *testing.T) string {
	t.Helper()
	if err := exec.Command("git", "cat-file", "-e", previousLayoutCommit+"^{commit}").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("commit %s is not in the repository's history (a shallow clone?): %v", previousLayoutCommit, err)
		}
		t.Skipf("commit %s is not in the repository's history (a shallow clone, or no git): %v", previousLayoutCommit, err)
	}
	// The sources go to the same directory on every run, so that the
	// build cache (whose keys hold the directory) serves the next run; a
	// lock keeps concurrent test processes out of each other's way, and
	// the sources go once built.
	src := filepath.Join(os.TempDir(), "ipcache-agent-test-previous-"+previousLayoutCommit[:12])
	lock, err := os.OpenFile(src+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, unix.Flock(int(lock.Fd()), unix.LOCK_EX))
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	require.NoError(t, os.RemoveAll(src))
	require.NoError(t, os.Mkdir(src, 0o700))
	defer os.RemoveAll(src)
	// From the top of the work tree: in a subdirectory git archives
	// only that subdirectory.
	archive := exec.Command("sh", "-c", `cd "$(git rev-parse --show-toplevel)" && git archive "$1" | tar -x -C "$2"`,
		"sh", previousLayoutCommit, src)
	out, err := archive.CombinedOutput()
	require.NoError(t, err, "git archive %s: %s", previousLayoutCommit, out)
	bin := filepath.Join(t.TempDir(), "ipcache-agent-previous")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ipcache-agent")
	build.Dir = src
	start := time.Now()
	out, err = build.CombinedOutput()
	require.NoError(t, err, "go build of %s: %s", previousLayoutCommit, out)
	t.Logf("built the agent of %s in %v", previousLayoutCommit[:7], time.Since(start).Round(time.Millisecond))
	return bin
}

// pinnedMapLayout is the type and size of a map pinned by the agent.
func (e *e2e) pinnedMapLayout(name string) (ebpf.MapType, uint32) {
	e.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(e.bpfRoot), name), nil)
	require.NoError(e.t, err, name)
	defer m.Close()
	return m.Type(), m.MaxEntries()
}

// TestPrivilegedUpgradeFromPreviousLayout: the agent of the previous map
// layout (built from the history) enforces a policy with a flat LPM
// `policy` map and a 2-slot `enforcement` array; this agent starts on the
// same bpffs and state while the endpoint pings an allowed address every
// millisecond. No probe is lost across the switch, the pins are then the
// new layout (the outer policy map of subjects, the enforcement array by
// subject and direction), the identities are the same, and the denied
// address stays denied.
func TestPrivilegedUpgradeFromPreviousLayout(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	previous := buildPreviousAgent(t)
	e := newE2E(t)
	e.writePolicy(allowedIP)
	e.agentBinary = previous
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)
	typ, _ := e.pinnedMapLayout(bpfmaps.PolicyName)
	require.Equal(t, ebpf.LPMTrie, typ, "the previous agent pins a flat LPM policy map")
	typ, size := e.pinnedMapLayout(bpfmaps.EnforcementName)
	require.Equal(t, ebpf.Array, typ)
	require.Equal(t, uint32(2), size, "the previous agent pins a 2-slot enforcement array")
	ipcacheBefore := e.pinnedIPCache()

	pinger := netnstest.StartPinger(t, e.epNS, allowedIP, time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	e.stopAgent()
	previousLog := e.agentLog.String()
	time.Sleep(200 * time.Millisecond) // the previous program enforces alone
	e.agentBinary = ""
	e.startAgent()
	require.Eventually(t, func() bool {
		typ, _ := e.pinnedMapLayout(bpfmaps.PolicyName)
		return typ == ebpf.HashOfMaps && e.policyMapIsTable()
	}, 20*time.Second, 20*time.Millisecond, "the new layout pinned and written: %s", e.agentLog)
	time.Sleep(500 * time.Millisecond)
	sent, replies, longest := pinger.Stop()
	t.Logf("1 ms ping across the upgrade: %d sent, %d answered", sent, replies)
	require.Greater(t, sent, 300, "probes sent across the upgrade")
	require.Equal(t, sent, replies, "probes lost across the upgrade, at most %d in a row, at %s; previous agent's log:\n%s\nthis agent's log:\n%s",
		longest, lostAt(pinger), previousLog, e.agentLog)

	typ, size = e.pinnedMapLayout(bpfmaps.EnforcementName)
	require.Equal(t, ebpf.Array, typ)
	require.Greater(t, size, uint32(2), "the enforcement array holds every subject's directions")
	// The previous agent's entries keep their identities; this agent adds
	// the host addresses of its namespace, which that one did not have.
	ipcacheAfter := e.pinnedIPCache()
	for prefix, id := range ipcacheBefore {
		require.Equal(t, id, ipcacheAfter[prefix], "the same identity of %s after the upgrade", prefix)
	}
	e.expect(pingProbe(e.epNS, allowedIP, answered), pingProbe(e.epNS, otherIP, lost))
	require.False(t, strings.Contains(e.agentLog.String(), "level=ERROR"), "errors logged: %s", e.agentLog)
}
