// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// e2e is an endpoint network namespace behind a veth whose host side is in
// a second namespace, where the agent runs: the host side carries two
// addresses (10.201.1.1 and 10.201.1.2) that the endpoint pings.
type e2e struct {
	t                 *testing.T
	epNS, hostNS      string
	bpfRoot, stateDir string
	policyDir         string
	agent             *exec.Cmd
	agentLog          *syncbuf.Buffer
	gracePeriod       string
	// extraArgs are more flags for the agent.
	extraArgs []string
	// farNS, if set, holds allowedIP and otherIP (moveAddressesFar);
	// hostAddrs are then the agent namespace's own addresses.
	farNS     string
	hostAddrs map[netip.Prefix]bool
	// agentBinary, if set, is the agent that startAgent runs instead of
	// this test binary (an agent of another build).
	agentBinary string
}

const (
	e2eDevice  = "ipcah0"
	allowedIP  = "10.201.1.1"
	otherIP    = "10.201.1.2"
	policyFile = "allow.yaml"
)

func mustRun(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%v: %s", args, out)
}

func newE2E(t *testing.T) *e2e {
	privileged.Test(t)
	// The tests run in parallel, each in namespaces of its own: the name
	// tells the test and the test process.
	suffix := strconv.Itoa(os.Getpid()%100000) + "-" + nsSafe.ReplaceAllString(t.Name(), "-")
	e := &e2e{
		t: t, epNS: "ipca-ep-" + suffix, hostNS: "ipca-host-" + suffix,
		bpfRoot: filepath.Join(t.TempDir(), "bpf"), stateDir: t.TempDir(), policyDir: t.TempDir(),
		gracePeriod: "2s",
	}
	t.Cleanup(e.cleanup)
	mustRun(t, "ip", "netns", "add", e.epNS)
	mustRun(t, "ip", "netns", "add", e.hostNS)
	mustRun(t, "ip", "-n", e.hostNS, "link", "add", e2eDevice, "type", "veth", "peer", "name", "eth0", "netns", e.epNS)
	mustRun(t, "ip", "-n", e.hostNS, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", "10.201.0.1/24", "dev", e2eDevice)
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", allowedIP+"/32", "dev", "lo")
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", otherIP+"/32", "dev", "lo")
	mustRun(t, "ip", "-n", e.hostNS, "link", "set", e2eDevice, "up")
	mustRun(t, "ip", "-n", e.epNS, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", e.epNS, "addr", "add", "10.201.0.2/24", "dev", "eth0")
	mustRun(t, "ip", "-n", e.epNS, "link", "set", "eth0", "up")
	mustRun(t, "ip", "-n", e.epNS, "route", "add", "default", "via", "10.201.0.1")

	// bpffs is mounted here, in the test's mount namespace, so that what
	// the agent pins (from inside `ip netns exec`, which makes a mount
	// namespace of its own) outlives each agent process.
	require.NoError(t, privileged.MountBPFFS(t, e.bpfRoot))
	// A fresh veth takes a moment before it carries traffic (longer on a
	// busy machine); tests start from a network that works.
	require.Eventually(t, func() bool { return e.reachable(allowedIP) }, 10*time.Second, 50*time.Millisecond,
		"the endpoint reaches %s before any agent runs", allowedIP)
	return e
}

func (e *e2e) cleanup() {
	e.stopAgent()
	agentCommand("cleanup", "--bpf-root="+e.bpfRoot, "--state-dir="+e.stateDir).Run()
	exec.Command("ip", "netns", "del", e.epNS).Run()
	exec.Command("ip", "netns", "del", e.hostNS).Run()
	unix.Unmount(e.bpfRoot, unix.MNT_DETACH)
}

func (e *e2e) writePolicy(allow string) {
	e.t.Helper()
	e.policyFile(policyFile, fmt.Sprintf("name: e2e\negress:\n  - toCIDR: [%q]\n", allow+"/32"))
}

func (e *e2e) startAgent() {
	e.t.Helper()
	binary := agentBinary()
	if e.agentBinary != "" {
		binary = e.agentBinary
	}
	args := []string{"netns", "exec", e.hostNS, binary,
		"--bpf-root=" + e.bpfRoot, "--state-dir=" + e.stateDir, "--policy-dir=" + e.policyDir,
		"--devices=" + e2eDevice, "--identity-restore-grace-period=" + e.gracePeriod,
		"--shell-sock-path=" + filepath.Join(e.stateDir, "shell.sock")}
	args = append(args, e.extraArgs...)
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), beAgentEnv+"=1")
	e.agentLog = &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = e.agentLog, e.agentLog
	require.NoError(e.t, cmd.Start())
	// Set once started: an agent that exited at start has nothing to stop.
	waitAgentStarted(e.t, e.agentLog, cmd.Process.Pid)
	e.agent = cmd
}

// exited reports whether the child pid has exited (a zombie not yet
// waited for), without waiting for it: its exec.Cmd's Wait still reaps it.
func exited(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return strings.HasPrefix(rest, "Z")
}

func (e *e2e) stopAgent() {
	if e.agent == nil {
		return
	}
	e.agent.Process.Signal(syscall.SIGTERM)
	err := e.agent.Wait()
	e.agent = nil
	require.NoError(e.t, err, "agent exit: %s", e.agentLog)
}

// reachable pings addr once from the endpoint.
func (e *e2e) reachable(addr string) bool { return pingsFrom(e.epNS, addr) }

// pingsFrom pings addr (IPv4 or IPv6) once from the namespace ns and
// reports whether the echo was answered within a second.
func pingsFrom(ns, addr string) bool {
	return exec.Command("ip", "netns", "exec", ns, "ping", "-c1", "-W1", addr).Run() == nil
}

func (e *e2e) waitVerdicts(allowed, denied string) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.reachable(allowed) && !e.reachable(denied) },
		20*time.Second, 100*time.Millisecond, "want %s allowed and %s denied; agent log:\n%s", allowed, denied, e.agentLog)
}

// pinnedIPCache reads the pinned ipcache map: prefix -> identity.
func (e *e2e) pinnedIPCache() map[netip.Prefix]identity.Number {
	e.t.Helper()
	m, err := bpfmaps.ReadIPCache(e.bpfRoot)
	require.NoError(e.t, err)
	return m
}

// health is the agent's `health` (with args, e.g. -o json), which fails
// while a scope is degraded or stopped: its rows either way. As shell, it
// is made in this process.
func (e *e2e) health(args ...string) string {
	e.t.Helper()
	out, err := e.tryShell(append([]string{"health"}, args...)...)
	require.NotErrorIs(e.t, err, cells.ErrNoAgent, "shell health: %s", out)
	return out
}

// shell runs a command of the agent's shell against the running agent
// and returns its output; a failed command fails the test.
func (e *e2e) shell(command ...string) string {
	e.t.Helper()
	out, err := e.tryShell(command...)
	require.NoError(e.t, err, "shell %v: %s", command, out)
	return out
}

// tryShell is shell for a command whose failure is an answer, not a
// defect: a poll of bpf/policy --diff, which fails while the map differs,
// or of ipcache/lookup, which fails while no entry holds the address. It
// returns the command's output and its error (with what it wrote to
// stderr).
//
// It makes the exchange `ipcache-agent shell <command>` makes
// (cells.ShellExchange) in this process: the tests poll the shell often,
// and a client process of this race-built binary costs its start-up on
// the cores the agents share. The shell command as a process (its exit
// codes, its output streams) is tested on its own, with the binary
// (shellcommands_test.go, main_test.go).
func (e *e2e) tryShell(command ...string) (string, error) {
	var out strings.Builder
	err := cells.ShellExchange(filepath.Join(e.stateDir, "shell.sock"), strings.Join(command, " "), &out)
	return out.String(), err
}

// requireJSONOutputs checks -o json of every project command against the
// running agent, and version's view of the programs its links hold.
func (e *e2e) requireJSONOutputs(id uint32, otherIP string) {
	t := e.t
	t.Helper()
	parse := func(command ...string) any {
		out := e.shell(append(command, "-o", "json")...)
		var v any
		require.NoError(t, json.Unmarshal([]byte(out), &v), "%v: %s", command, out)
		return v
	}
	var identity map[string]any
	for _, row := range parse("identity/list").([]any) {
		if row.(map[string]any)["identity"] == float64(id) {
			identity = row.(map[string]any)
		}
	}
	require.NotNil(t, identity, "identity %d listed", id)
	require.Contains(t, identity["users"].(map[string]any)["resources"].(map[string]any)["first"], "policy/e2e")
	require.Equal(t, float64(id), parse("identity/show", strconv.Itoa(int(id))).(map[string]any)["identity"])
	lookup := parse("ipcache/lookup", otherIP).(map[string]any)
	require.Equal(t, otherIP+"/32", lookup["prefix"])
	require.Equal(t, float64(id), lookup["identity"])
	files := parse("policy/list").([]any)
	require.Equal(t, "in force", files[0].(map[string]any)["status"])
	explain := parse("policy/explain", otherIP, "egress").(map[string]any)
	require.Equal(t, true, explain["allowed"])
	require.Equal(t, float64(id), explain["identity"])
	require.Equal(t, true, parse("restore/status").(map[string]any)["released"])
	var health []any
	require.NoError(t, json.Unmarshal([]byte(e.health("-o", "json")), &health))
	require.NotEmpty(t, health)
	egress := parse("datapath/counters").(map[string]any)["egress"].(map[string]any)
	require.Positive(t, egress["allowed"])
	require.Positive(t, egress["dropped"])
	require.IsType(t, []any{}, parse("conntrack/list"))
	require.Positive(t, parse("bpf/ipcache").(map[string]any)["total"])
	require.Positive(t, parse("bpf/policy").(map[string]any)["total"])
	require.Equal(t, float64(0), parse("bpf/ipcache", "--diff").(map[string]any)["total"], "the map is the table")
	require.Equal(t, float64(0), parse("bpf/policy", "--diff").(map[string]any)["total"], "the map is the table")

	// version reads the programs the agent's pinned links hold: this build's.
	stdout, stderr, code := runAgentCommand(t, "version", "-o", "json", "--bpf-root", e.bpfRoot)
	require.Zero(t, code, "stderr: %s", stderr)
	var v struct {
		Attached []struct {
			Link, Name, Tag, BuildProgram, Hook, Enforces string
			ProgramID                                     uint32 `json:"programId"`
		}
		AttachedError string
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &v), "%s", stdout)
	require.Empty(t, v.AttachedError)
	require.NotEmpty(t, v.Attached)
	for _, a := range v.Attached {
		require.NotZero(t, a.ProgramID)
		require.Regexp(t, `^[0-9a-f]{16}$`, a.Tag)
		// The device's ingress: traffic from the endpoint, its egress.
		want, hook, enforces := "enforce_from_endpoint", "tcx-ingress", "endpoint egress"
		if strings.HasSuffix(a.Link, "-egress") {
			want, hook, enforces = "enforce_to_endpoint", "tcx-egress", "endpoint ingress"
		}
		require.Equal(t, want, a.BuildProgram, "%s: %s", a.Link, stdout)
		require.Equal(t, hook, a.Hook, "%s: %s", a.Link, stdout)
		require.Equal(t, enforces, a.Enforces, "%s: %s", a.Link, stdout)
	}
}

// pinnedPolicy reads the pinned policy map: key -> verdict.
func (e *e2e) pinnedPolicy() map[bpfmaps.PolicyKey]uint32 {
	e.t.Helper()
	m, err := bpfmaps.ReadPolicy(e.bpfRoot)
	require.NoError(e.t, err)
	return m
}

// nsSafe matches what a test's name may hold that a namespace's name
// (a file in /run/netns) should not.
var nsSafe = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// TestPrivilegedEndToEnd runs the agent binary on the host side of an
// endpoint: a policy file allows one address and not another; editing the
// file flips them; a continuous ping to the allowed address across a
// restart of the agent and past the restore grace period loses nothing,
// and both pinned maps are the same before and after.
func TestPrivilegedEndToEnd(t *testing.T) {
	t.Parallel()
	e := newE2E(t)
	require.True(t, e.reachable(allowedIP) && e.reachable(otherIP), "before the agent, everything passes")

	e.writePolicy(allowedIP)
	e.startAgent()
	e.waitVerdicts(allowedIP, otherIP)

	// The shell: root only, and it answers.
	sock, err := os.Stat(filepath.Join(e.stateDir, "shell.sock"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), sock.Mode().Perm(), "socket mode")
	dir, err := os.Stat(e.stateDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dir.Mode().Perm(), "socket directory mode")
	lookup := e.shell("ipcache/lookup", allowedIP)
	require.Regexp(t, `Prefix: +`+regexp.QuoteMeta(allowedIP)+`/32`, lookup)
	require.Contains(t, lookup, "policy/e2e")
	require.Contains(t, e.shell("db/show", "identities"), "cidr:"+allowedIP+"/32")

	e.writePolicy(otherIP)
	e.waitVerdicts(otherIP, allowedIP)
	before, policyBefore := e.pinnedIPCache(), e.pinnedPolicy()
	require.Contains(t, before, netip.MustParsePrefix(otherIP+"/32"))
	require.Len(t, policyBefore, 1)

	// 20 pings a second for the whole restart and past the grace period.
	ping := exec.Command("ip", "netns", "exec", e.epNS, "ping", "-i", "0.05", "-W", "1", otherIP)
	var pingOut syncbuf.Buffer
	ping.Stdout = &pingOut
	require.NoError(t, ping.Start())
	time.Sleep(time.Second)
	e.stopAgent()
	time.Sleep(500 * time.Millisecond) // enforcement while no agent runs
	e.startAgent()
	require.Contains(t, e.shell("restore/status"), "Restored: ")
	sock, err = os.Stat(filepath.Join(e.stateDir, "shell.sock"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), sock.Mode().Perm(), "socket mode after a restart")
	time.Sleep(4 * time.Second) // past the 2s grace period
	require.NoError(t, ping.Process.Signal(syscall.SIGINT))
	_ = ping.Wait()

	match := pingSummary.FindStringSubmatch(pingOut.String())
	require.NotNil(t, match, "ping output: %s", &pingOut)
	sent, _ := strconv.Atoi(match[1])
	received, _ := strconv.Atoi(match[2])
	t.Logf("continuous ping across restart: %d sent, %d received", sent, received)
	require.Greater(t, sent, 80)
	require.Equal(t, sent, received, "no packet lost across the restart")

	require.Equal(t, before, e.pinnedIPCache(), "same identity numbers after the restart and the grace period")
	require.Equal(t, policyBefore, e.pinnedPolicy(), "same policy map after the restart and the grace period")
	// Every project command of the shell answers with what it is about.
	id := before[netip.MustParsePrefix(otherIP+"/32")]
	// otherIP is an address of the agent's namespace: node/host owns it
	// too.
	require.Regexp(t, fmt.Sprintf(`%d +1 +%s/32 +(node/host,)?policy/e2e`, id, regexp.QuoteMeta(otherIP)), e.shell("identity/list"))
	require.Contains(t, e.shell("identity/show", strconv.Itoa(int(id))), "owner policy/e2e")
	require.Contains(t, e.shell("policy/list"), "e2e")
	require.Contains(t, e.shell("policy/explain", otherIP, "egress"), "e2e")
	require.Contains(t, e.shell("restore/status"), "Released: true")
	require.Regexp(t, `ipcache.*level=OK`, e.shell("health"))
	counters := e.shell("datapath/counters")
	require.Regexp(t, `egress +[1-9]\d* +[1-9]\d*`, counters, "egress allowed and dropped packets counted")
	e.requireJSONOutputs(uint32(id), otherIP)
	require.False(t, e.reachable(allowedIP), "still denied")
}
