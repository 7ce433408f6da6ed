// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The harness end to end at 200 prefixes, IPv4 and IPv6: under the agent
// and under nft the server's allowed addresses connect and its others do
// not, until the change allows one; with no filter every address
// connects. A filter that let everything through (or blocked everything)
// fails the run, so no figure of the benchmark is a non-filter's. The
// namespaces and the agent's bpffs are gone afterwards.
func TestPrivilegedHarnessEnforces(t *testing.T) {
	privileged.Test(t)
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nft is missing (Debian's nftables; .ci/run installs it)")
		}
		t.Skip("nft is missing: apt-get install nftables")
	}
	agent := filepath.Join(t.TempDir(), "ipcache-agent")
	build := exec.Command("go", "build", "-o", agent, "github.com/ipcache-agent/ipcache-agent/cmd/ipcache-agent")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the agent: %s", out)

	cfg, scenarios, err := parseFlags("200", "mixed", "host", "none,agent,nft", agent, 1, 200*time.Millisecond, "json", 0)
	require.NoError(t, err)
	cfg.work, cfg.progress = t.TempDir(), io.Discard
	r, err := runScenario(cfg, scenarios[0])
	require.NoError(t, err)

	require.Len(t, r.Modes, 4, "none, agent, nft, none again")
	for _, m := range r.Modes {
		require.True(t, m.AllowedConnects, "%s: the allowed addresses connect", m.Mode)
		require.Positive(t, m.RRPerSecond, m.Mode)
		require.Positive(t, m.RRP50Micros, m.Mode)
		require.Positive(t, m.BulkGbitPerSec, m.Mode)
		if m.Mode == modeNone || m.Mode == modeNoneAfter {
			require.True(t, m.OutsideConnects, "without a filter the outside address connects")
			require.True(t, m.ChangeConnects, "without a filter the change's address connects")
			continue
		}
		require.False(t, m.OutsideConnects, "%s: the outside address is dropped", m.Mode)
		require.False(t, m.ChangeConnects, "%s: the change's address is dropped before the change", m.Mode)
		require.Positive(t, m.LoadSeconds, m.Mode)
		require.Positive(t, m.ChangeMillis, "%s: the change's address connects after it", m.Mode)
	}
	require.Positive(t, r.Modes[1].BPFMapBytes, "the agent's maps")
	require.Positive(t, r.Modes[1].UserRSSBytes, "the agent's RSS")

	var table bytes.Buffer
	printTable(&table, []Result{r})
	require.Len(t, strings.Split(strings.TrimSpace(table.String()), "\n"), 5, table.String())

	netns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	require.NotContains(t, string(netns), fmt.Sprintf("bpeer-%d-", os.Getpid()), "the namespaces are removed")
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(mounts), cfg.work, "the agent's bpffs is unmounted")
}

func TestPolicyPrefixes(t *testing.T) {
	for _, tc := range []struct {
		family string
		mixed  bool
	}{{"ipv4", false}, {"ipv6", false}, {"mixed", false}, {"ipv4", true}, {"mixed", true}} {
		p := policyPrefixes(5000, tc.family, tc.mixed)
		require.Len(t, p, 5000, tc)
		lengths := map[int]bool{}
		v4, v6 := 0, 0
		for i, a := range p {
			require.Equal(t, a.Masked(), a, "%v: %s has host bits", tc, a)
			lengths[a.Bits()] = true
			if a.Addr().Is4() {
				v4++
			} else {
				v6++
			}
			for _, s := range []serverAddrs{serverV4, serverV6} {
				require.False(t, a.Contains(netip.MustParseAddr(s.outside)), "%v: %s holds the outside address", tc, a)
				require.False(t, a.Contains(netip.MustParseAddr(s.change)), "%v: %s holds the change's address", tc, a)
			}
			// Sorted by construction per family: a prefix neither
			// overlaps nor touches the one before it of its family.
			for j := i - 1; j >= 0 && j >= i-2; j-- {
				if p[j].Addr().Is4() == a.Addr().Is4() && i < len(p)-2 {
					require.False(t, p[j].Overlaps(a), "%v: %s overlaps %s", tc, p[j], a)
				}
			}
		}
		switch tc.family {
		case "ipv4":
			require.Zero(t, v6)
			require.Contains(t, p, netip.MustParsePrefix(serverV4.allowed+"/32"))
		case "ipv6":
			require.Zero(t, v4)
			require.Contains(t, p, netip.MustParsePrefix(serverV6.allowed+"/128"))
		case "mixed":
			require.InDelta(t, v4, v6, 2)
			require.Contains(t, p, netip.MustParsePrefix(serverV4.allowed+"/32"))
			require.Contains(t, p, netip.MustParsePrefix(serverV6.allowed+"/128"))
		}
		if tc.mixed {
			require.Greater(t, len(lengths), 4, "%v: mixed lengths", tc)
		} else {
			require.LessOrEqual(t, len(lengths), 2, tc)
		}
	}
}

func TestParseFlags(t *testing.T) {
	_, s, err := parseFlags("1000 100000", "ipv4,mixed", "host", "none,agent,nft", "a", 3, time.Second, "text", 0)
	require.NoError(t, err)
	require.Equal(t, []scenario{{"ipv4", 1000}, {"ipv4", 100000}, {"mixed", 1000}, {"mixed", 100000}}, s)
	for _, bad := range [][]string{
		{"1", "ipv4", "host", "none", "text"},
		{"10", "ipv5", "host", "none", "text"},
		{"10", "ipv4", "some", "none", "text"},
		{"10", "ipv4", "host", "iptables", "text"},
		{"10", "ipv4", "host", "none", "yaml"},
	} {
		_, _, err := parseFlags(bad[0], bad[1], bad[2], bad[3], "a", 1, time.Second, bad[4], 0)
		require.Error(t, err, bad)
	}
}

// The names comparison end to end at 20 names: with no filter an unasked
// name's address connects; under the agent's toFQDNs and under dnsmasq's
// --nftset it does not, and every asked name's address connects. The
// agent holds each answer until its address is allowed: no first
// connection is dropped.
func TestPrivilegedNamesEnforce(t *testing.T) {
	privileged.Test(t)
	for _, tool := range []string{"nft", "dnsmasq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is missing (.ci/run installs it)", tool)
			}
			t.Skipf("%s is missing: apt-get install nftables dnsmasq-base", tool)
		}
	}
	agent := filepath.Join(t.TempDir(), "ipcache-agent")
	out, err := exec.Command("go", "build", "-o", agent, "github.com/ipcache-agent/ipcache-agent/cmd/ipcache-agent").CombinedOutput()
	require.NoError(t, err, "build the agent: %s", out)

	cfg, scenarios, err := parseFlags("", "ipv4", "host", "none,agent,nft", agent, 1, time.Second, "json", 20)
	require.NoError(t, err)
	require.Empty(t, scenarios)
	cfg.work, cfg.progress = t.TempDir(), io.Discard
	r, err := runNames(cfg, 20)
	require.NoError(t, err)
	require.Len(t, r.Modes, 4, "direct, forward, agent, nft")
	for _, m := range r.Modes {
		require.Positive(t, m.QueryP50Micros, m.Mode)
		require.GreaterOrEqual(t, m.ConnectP50Micro, m.QueryP50Micros, m.Mode)
		filtered := m.Mode == modeAgent || m.Mode == modeNft
		require.Equal(t, !filtered, m.UnaskedConnects, "%s: an unasked name's address", m.Mode)
	}
	require.Zero(t, r.Modes[2].FirstDropped, "the agent holds the answer until its address is allowed")

	netns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	require.NotContains(t, string(netns), fmt.Sprintf("bpeer-%d-", os.Getpid()), "the namespaces are removed")
}

// A run stopped by SIGTERM (or ^C) removes what it made, as one that
// ends does: the agent stops and its pins and bpffs go, the namespaces
// go, the scratch directory goes; it exits with 128 + the signal.
func TestPrivilegedInterruptRemovesTheRun(t *testing.T) {
	privileged.Test(t)
	bin := t.TempDir()
	agent, benchPeer := filepath.Join(bin, "ipcache-agent"), filepath.Join(bin, "bench-peer")
	for path, pkg := range map[string]string{agent: "cmd/ipcache-agent", benchPeer: "cmd/bench-peer"} {
		out, err := exec.Command("go", "build", "-o", path, "github.com/ipcache-agent/ipcache-agent/"+pkg).CombinedOutput()
		require.NoError(t, err, "build %s: %s", pkg, out)
	}
	run := exec.Command(benchPeer, "-agent", agent, "-modes", "agent", "-sizes", "200", "-families", "ipv4",
		"-rounds", "1", "-duration", "30s")
	var progress syncbuf.Buffer
	run.Stdout, run.Stderr = io.Discard, &progress
	require.NoError(t, run.Start())
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	t.Cleanup(func() {
		if run.ProcessState == nil {
			_ = run.Process.Kill()
			<-exited
		}
	})

	// The agent, once it runs: its bpffs is in the scratch directory.
	var agentPID int
	var bpfRoot string
	require.Eventually(t, func() bool {
		agentPID, bpfRoot = processOf(agent)
		return agentPID != 0
	}, 60*time.Second, 50*time.Millisecond, "the agent does not start: %s", progress.String())
	// Enforcing, and the traffic under way.
	require.Eventually(t, func() bool {
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		return strings.Contains(string(mounts), bpfRoot) && processCPU(agentPID) > 0
	}, 30*time.Second, 50*time.Millisecond)
	time.Sleep(2 * time.Second)

	require.NoError(t, run.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, progress.String())
		require.Equal(t, 128+int(syscall.SIGTERM), exit.ExitCode(), progress.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("bench-peer did not exit: %s", progress.String())
	}
	require.Contains(t, progress.String(), "removing what the run made")

	require.NoDirExists(t, bpfRoot, "the scratch directory is removed")
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(mounts), bpfRoot, "the agent's bpffs is unmounted")
	netns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	require.NotContains(t, string(netns), fmt.Sprintf("bpeer-%d-", run.Process.Pid), "the namespaces are removed")
	_, err = os.Stat(fmt.Sprintf("/proc/%d", agentPID))
	require.ErrorIs(t, err, os.ErrNotExist, "the agent is stopped")
}

// processOf finds a running process of binary and its --bpf-root.
func processOf(binary string) (pid int, bpfRoot string) {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if args[0] != binary {
			continue
		}
		for _, a := range args {
			if root, ok := strings.CutPrefix(a, "--bpf-root="); ok {
				return p, root
			}
		}
	}
	return 0, ""
}

// An interrupt undoes what is registered, the latest first, once: what a
// step's defer runs after it does nothing, and what is made after it is
// undone at once.
func TestUndoInterrupt(t *testing.T) {
	u := newUndo()
	var ran []string
	record := func(name string) func() { return func() { ran = append(ran, name) } }
	doneNamespaces := u.add(record("namespaces"))
	doneAgent := u.add(record("agent"))
	u.add(record("scratch"))() // removed by its step: not again
	u.interrupt()
	require.Equal(t, []string{"scratch", "agent", "namespaces"}, ran)
	doneAgent()
	doneNamespaces()
	require.Len(t, ran, 3, "the steps' defers after the interrupt")
	u.add(record("late"))()
	require.Equal(t, []string{"scratch", "agent", "namespaces", "late"}, ran, "made after the interrupt: undone at once, once")

	var none *undo
	none.add(record("alone"))()
	require.Equal(t, "alone", ran[len(ran)-1], "without an undo the step removes what it made")
}
