// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Make before break (datapathcell/README.md) through the real binary: a
// ping every millisecond
// through the enforcement program while a policy change that keeps the
// address allowed is applied, and not one probe lost, round after round.

// These tests do not run in parallel with the others: the pinger is a
// goroutine of the test process, and the probe rate they require (one per
// 5 ms at worst) is not kept with the other tests' agents and samplers on
// the same two cores.

// mbbAfter is how long the probes go on once the change is applied.
const mbbAfter = 200 * time.Millisecond

// epAddr is the endpoint's address, which the host side pings in the
// ingress tests; hostSideAddr is the source of those pings.
const (
	epAddr       = "10.201.0.2"
	hostSideAddr = "10.201.0.1"
)

// policyFile writes a policy file atomically.
func (e *e2e) policyFile(name, content string) {
	e.t.Helper()
	tmp := filepath.Join(e.policyDir, ".tmp")
	require.NoError(e.t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(e.t, os.Rename(tmp, filepath.Join(e.policyDir, name)))
}

func (e *e2e) removePolicyFile(name string) {
	e.t.Helper()
	require.NoError(e.t, os.Remove(filepath.Join(e.policyDir, name)))
}

// mbbPolicy is a policy file of one rule in dir (egress: toCIDR, ingress:
// fromCIDR) with cidrs and n other /32s in 10.240.0.0/12.
func mbbPolicy(name string, dir policy.Direction, n int, cidrs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\n", name)
	field := "toCIDR"
	if dir == policy.Ingress {
		field = "fromCIDR"
	}
	fmt.Fprintf(&b, "%s:\n  - %s:\n", dir, field)
	for _, c := range cidrs {
		fmt.Fprintf(&b, "      - %q\n", c)
	}
	for i := range n {
		fmt.Fprintf(&b, "      - \"10.%d.%d.%d/32\"\n", 240+i/65536, i/256%256, i%256)
	}
	return b.String()
}

// The far namespace of the make-before-break tests (moveAddressesFar):
// the link to it from the agent's namespace, and its address there.
const (
	farDevice   = "ipcaf0"
	farHostSide = "10.201.9.1"
	farAddr     = "10.201.9.2"
)

// moveAddressesFar moves allowedIP and otherIP from the agent's namespace
// to a namespace of their own, behind a link the agent does not enforce
// and routed by the agent's namespace. The make-before-break tests count
// the pinned ipcache entries their policies make: the addresses of the
// agent's own namespace are the host entity's, always in the ipcache
// (nodecell), and state leaves them out; the pinged addresses must be
// none of them. farAddr, inside the policies' 10.201.0.0/16 and no address
// of the agent's namespace, is a source for ingress.
func (e *e2e) moveAddressesFar() {
	t := e.t
	e.farNS = strings.Replace(e.hostNS, "ipca-host-", "ipca-far-", 1)
	mustRun(t, "ip", "netns", "add", e.farNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", e.farNS).Run() })
	for _, addr := range []string{allowedIP, otherIP} {
		mustRun(t, "ip", "-n", e.hostNS, "addr", "del", addr+"/32", "dev", "lo")
		mustRun(t, "ip", "-n", e.farNS, "addr", "add", addr+"/32", "dev", "lo")
	}
	mustRun(t, "ip", "-n", e.hostNS, "link", "add", farDevice, "type", "veth", "peer", "name", "eth0", "netns", e.farNS)
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", farHostSide+"/30", "dev", farDevice)
	mustRun(t, "ip", "-n", e.hostNS, "link", "set", farDevice, "up")
	mustRun(t, "ip", "-n", e.farNS, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", e.farNS, "addr", "add", farAddr+"/30", "dev", "eth0")
	mustRun(t, "ip", "-n", e.farNS, "link", "set", "eth0", "up")
	mustRun(t, "ip", "-n", e.farNS, "route", "add", "default", "via", farHostSide)
	for _, addr := range []string{allowedIP, otherIP} {
		mustRun(t, "ip", "-n", e.hostNS, "route", "add", addr+"/32", "via", farAddr)
	}
	mustRun(t, "ip", "netns", "exec", e.hostNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	require.Eventually(t, func() bool { return e.reachable(allowedIP) && pingsFrom(e.farNS, epAddr) },
		10*time.Second, 50*time.Millisecond, "the endpoint reaches %s in the far namespace, and back", allowedIP)
}

// hostPrefixes returns the addresses of the agent's namespace, as the
// node cell puts them in the ipcache (/32, /128).
func (e *e2e) hostPrefixes() map[netip.Prefix]bool {
	e.t.Helper()
	out, err := exec.Command("ip", "-n", e.hostNS, "-j", "addr", "show").Output()
	require.NoError(e.t, err)
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	require.NoError(e.t, json.Unmarshal(out, &links))
	prefixes := map[netip.Prefix]bool{}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			addr := netip.MustParseAddr(a.Local)
			prefixes[netip.PrefixFrom(addr, addr.BitLen())] = true
		}
	}
	return prefixes
}

// state is what the pinned maps say: the ipcache entries (but the host
// addresses of the agent's namespace: hostPrefixes) and the enforcement
// switches.
func (e *e2e) state() (map[netip.Prefix]uint32, [2]bool) {
	if e.hostAddrs == nil {
		e.hostAddrs = e.hostPrefixes()
	}
	pinned, err := bpfmaps.ReadIPCache(e.bpfRoot)
	require.NoError(e.t, err)
	ipcache := make(map[netip.Prefix]uint32, len(pinned))
	for prefix, id := range pinned {
		if !e.hostAddrs[prefix] {
			ipcache[prefix] = uint32(id)
		}
	}
	enforced, err := bpfmaps.ReadEnforcement(e.bpfRoot)
	require.NoError(e.t, err)
	return ipcache, enforced
}

// pingDuring pings to from the namespace from, one probe a millisecond,
// from before change is made until mbbAfter after applied says the pinned
// maps show it. It fails unless every probe is answered.
func (e *e2e) pingDuring(what, from, to string, change func(), applied func(map[netip.Prefix]uint32, [2]bool) bool) {
	e.t.Helper()
	pinger := netnstest.StartPinger(e.t, from, to, time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	change()
	deadline := start.Add(time.Minute)
	for !applied(e.state()) {
		if time.Now().After(deadline) {
			pinger.Stop()
			e.t.Fatalf("%s: not applied after a minute; agent log:\n%s", what, e.agentLog)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	time.Sleep(mbbAfter)
	sent, answered, longest := pinger.Stop()
	e.t.Logf("%s: applied after %s; %d probes, %d answered", what, took.Round(time.Millisecond), sent, answered)
	// A probe every millisecond, or not far from it on a busy machine.
	require.Greater(e.t, sent, int(took/(5*time.Millisecond)), "%s: too few probes to tell", what)
	require.Equal(e.t, sent, answered, "%s: probes lost, at most %d in a row, sent at %s; agent log:\n%s",
		what, longest, lostAt(pinger), e.agentLog)
}

// lostAt names when the probes a pinger lost were sent (the first ten),
// in the agent log's time format.
func lostAt(p *netnstest.Pinger) string {
	var at []string
	for _, t := range p.LostAt() {
		if len(at) == 10 {
			at = append(at, "...")
			break
		}
		at = append(at, t.UTC().Format("15:04:05.000"))
	}
	return strings.Join(at, ", ")
}

func prefixOf(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestPrivilegedMakeBeforeBreakFirstAndLastPolicy: the first egress
// policy, with 20,000 other prefixes, allows the pinged address; then it
// is deleted. Before, in between and after, the address is allowed.
func TestPrivilegedMakeBeforeBreakFirstAndLastPolicy(t *testing.T) {
	e := newE2E(t)
	e.moveAddressesFar()
	e.extraArgs = []string{"--policy-map-max-entries=65536"}
	e.startAgent()
	const others = 20000
	for round := range 5 {
		e.pingDuring(fmt.Sprintf("round %d: first policy", round), e.epNS, allowedIP,
			func() { e.policyFile("first.yaml", mbbPolicy("first", policy.Egress, others, "10.201.0.0/16")) },
			func(ipcache map[netip.Prefix]uint32, enforced [2]bool) bool {
				return enforced[policy.Egress] && len(ipcache) == others+1
			})
		e.pingDuring(fmt.Sprintf("round %d: policy deleted", round), e.epNS, allowedIP,
			func() { e.removePolicyFile("first.yaml") },
			func(ipcache map[netip.Prefix]uint32, enforced [2]bool) bool {
				return !enforced[policy.Egress] && len(ipcache) == 0
			})
	}
}

// narrowerComesAndGoes: inside an allowed /16, a second policy names the
// pinged address's /32 with 8,000 other /32s (the address gets an identity
// of its own), and is deleted again (the address falls back to the /16).
func narrowerComesAndGoes(t *testing.T, dir policy.Direction, fromHost bool, to, narrow string) {
	e := newE2E(t)
	e.moveAddressesFar()
	from := e.epNS
	if fromHost {
		from = e.farNS
	}
	e.policyFile("wide.yaml", mbbPolicy("wide", dir, 0, "10.201.0.0/16"))
	e.startAgent()
	require.Eventually(t, func() bool {
		ipcache, enforced := e.state()
		return enforced[dir] && len(ipcache) == 1
	}, 20*time.Second, 10*time.Millisecond, "wide policy in force")
	const others = 8000
	for round := range 5 {
		e.pingDuring(fmt.Sprintf("round %d: narrow /32 appears", round), from, to,
			func() { e.policyFile("narrow.yaml", mbbPolicy("narrow", dir, others, narrow+"/32")) },
			func(ipcache map[netip.Prefix]uint32, _ [2]bool) bool {
				_, ok := ipcache[prefixOf(narrow+"/32")]
				return ok && len(ipcache) == others+2
			})
		e.pingDuring(fmt.Sprintf("round %d: narrow /32 goes", round), from, to,
			func() { e.removePolicyFile("narrow.yaml") },
			func(ipcache map[netip.Prefix]uint32, _ [2]bool) bool { return len(ipcache) == 1 })
	}
}

// TestPrivilegedMakeBeforeBreakNarrowerPrefix: egress, the endpoint pings.
func TestPrivilegedMakeBeforeBreakNarrowerPrefix(t *testing.T) {
	narrowerComesAndGoes(t, policy.Egress, false, allowedIP, allowedIP)
}

// TestPrivilegedMakeBeforeBreakNarrowerPrefixIngress: ingress, the far
// namespace pings the endpoint through the agent's.
func TestPrivilegedMakeBeforeBreakNarrowerPrefixIngress(t *testing.T) {
	narrowerComesAndGoes(t, policy.Ingress, true, epAddr, farAddr)
}

// TestPrivilegedMakeBeforeBreakPolicyEdit: an edit swaps the allowing CIDR
// for another that covers the same address: narrower, wider, narrower.
func TestPrivilegedMakeBeforeBreakPolicyEdit(t *testing.T) {
	e := newE2E(t)
	e.moveAddressesFar()
	e.policyFile("p.yaml", mbbPolicy("p", policy.Egress, 0, "10.201.0.0/16"))
	e.startAgent()
	require.Eventually(t, func() bool {
		ipcache, enforced := e.state()
		_, ok := ipcache[prefixOf("10.201.0.0/16")]
		return enforced[policy.Egress] && ok
	}, 20*time.Second, 10*time.Millisecond, "policy in force")
	for round, cidr := range []string{"10.201.1.0/24", "10.0.0.0/8", "10.201.1.1/32", "10.201.0.0/16"} {
		e.pingDuring(fmt.Sprintf("round %d: to %s", round, cidr), e.epNS, allowedIP,
			func() { e.policyFile("p.yaml", mbbPolicy("p", policy.Egress, 0, cidr)) },
			func(ipcache map[netip.Prefix]uint32, _ [2]bool) bool {
				_, ok := ipcache[prefixOf(cidr)]
				return ok && len(ipcache) == 1
			})
	}
}

// TestPrivilegedMakeBeforeBreakFullPolicyMap: the policy map is full when
// the pinged address gets a /32 of its own: the address keeps its old,
// working identity, the failure shows; once room appears the address moves
// to its own identity, and no probe is lost throughout.
func TestPrivilegedMakeBeforeBreakFullPolicyMap(t *testing.T) {
	e := newE2E(t)
	e.moveAddressesFar()
	// Full with wide's and other's prefixes, and the two host addresses
	// inside wide's (hostSideAddr, farHostSide): each its own identity.
	e.extraArgs = []string{"--policy-map-max-entries=5"}
	e.policyFile("wide.yaml", mbbPolicy("wide", policy.Egress, 0, "10.201.0.0/16"))
	e.policyFile("other.yaml", mbbPolicy("other", policy.Egress, 0, "10.9.0.0/16", "10.8.0.0/16"))
	e.startAgent()
	require.Eventually(t, func() bool {
		ipcache, enforced := e.state()
		return enforced[policy.Egress] && len(ipcache) == 3
	}, 20*time.Second, 10*time.Millisecond, "the map is full")
	ipcache, _ := e.state()
	wide := ipcache[prefixOf("10.201.0.0/16")]

	e.pingDuring("map full", e.epNS, allowedIP,
		func() { e.policyFile("narrow.yaml", mbbPolicy("narrow", policy.Egress, 0, allowedIP+"/32")) },
		func(map[netip.Prefix]uint32, [2]bool) bool {
			return strings.Contains(e.shell("datapath/ipcache-status"), "policy entries of the identity are not in the policy map")
		})
	ipcache, _ = e.state()
	_, own := ipcache[prefixOf(allowedIP+"/32")]
	require.False(t, own, "the /32 is held while its identity's policy entry is not in the map")
	require.Equal(t, wide, ipcache[prefixOf("10.201.0.0/16")])
	explained := e.shell("policy/explain", allowedIP, "egress")
	require.Contains(t, explained, "not in the policy map")
	// What the datapath really does: the held /32 leaves the address the
	// wide prefix's identity, whose entry allows it.
	require.Contains(t, explained, fmt.Sprintf("the datapath uses identity %d for %s", wide, allowedIP))
	require.Regexp(t, fmt.Sprintf(`(?m)^Maps: identity %d, egress enforced, policy map entry %d/egress/\S+: allow$`, wide, wide), explained)
	require.Regexp(t, `ipcache.*level=Degraded`, e.health())

	e.pingDuring("room appears", e.epNS, allowedIP,
		func() { e.removePolicyFile("other.yaml") },
		func(ipcache map[netip.Prefix]uint32, _ [2]bool) bool {
			_, own := ipcache[prefixOf(allowedIP+"/32")]
			return own && len(ipcache) == 2
		})
}
