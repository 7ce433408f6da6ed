// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

const (
	testIdentityWorld   = 2
	testIdentityAllowed = 1<<24 | 1
	testIdentityDenied  = 1<<24 | 2

	testProtoTCP = 6
	testProtoUDP = 17

	// progRunIfindex is the device of packets run with BPF_PROG_RUN
	// without a context: the loopback, which is 1 in every namespace.
	progRunIfindex = 1
)

// The C declarations of the maps must match bpfmaps/mapspecs.go: the loader swaps
// them for the agent's pinned maps, which are made from those specs.
func TestEnforceObjectMatchesMapSpecs(t *testing.T) {
	t.Parallel()
	spec, err := bpf.LoadEnforce()
	require.NoError(t, err)

	for _, want := range []*ebpf.MapSpec{bpfmaps.IPCacheSpec(1), bpfmaps.PoliciesSpec(1), bpfmaps.EnforcementSpec(), bpfmaps.EndpointsSpec(), bpfmaps.CountersSpec(), bpfmaps.ConntrackSpec(1), bpfmaps.RevisionSpec(), bpfmaps.DNSProxySpec(), bpfmaps.DNSAnswersSpec(), bpfmaps.DNSAnswersLostSpec()} {
		name := want.Name
		// A C name has no '-'.
		switch name {
		case bpfmaps.DNSProxyName:
			name = bpf.EnforceMapDnsProxy
		case bpfmaps.DNSAnswersName:
			name = bpf.EnforceMapDnsAnswers
		case bpfmaps.DNSAnswersLostName:
			name = bpf.EnforceMapDnsAnswersLost
		}
		got, ok := spec.Maps[name]
		require.True(t, ok, "map %s not declared in enforce.c", want.Name)
		require.Equal(t, want.Type, got.Type, want.Name)
		require.Equal(t, want.KeySize, got.KeySize, want.Name)
		require.Equal(t, want.ValueSize, got.ValueSize, want.Name)
		require.Equal(t, want.Flags, got.Flags, want.Name)
	}
	// The program's own per-CPU clock (enforce.c now_ns), not a pinned map.
	clock, ok := spec.Maps[bpf.EnforceMapClock]
	require.True(t, ok)
	require.Equal(t, ebpf.PerCPUArray, clock.Type)
	require.EqualValues(t, 4, clock.KeySize)
	require.EqualValues(t, 16, clock.ValueSize)
	require.EqualValues(t, 1, clock.MaxEntries)
	require.Empty(t, clock.Pinning)
	// Sizes that are not configuration.
	require.Equal(t, bpfmaps.EnforcementSpec().MaxEntries, spec.Maps[bpfmaps.EnforcementName].MaxEntries)
	require.Equal(t, bpfmaps.CountersSpec().MaxEntries, spec.Maps[bpfmaps.CountersName].MaxEntries)
	require.Equal(t, bpfmaps.DNSProxySpec().MaxEntries, spec.Maps[bpf.EnforceMapDnsProxy].MaxEntries)
	require.Equal(t, bpfmaps.DNSAnswersSpec().MaxEntries, spec.Maps[bpf.EnforceMapDnsAnswers].MaxEntries)
	require.Equal(t, bpfmaps.DNSAnswersLostSpec().MaxEntries, spec.Maps[bpf.EnforceMapDnsAnswersLost].MaxEntries)
	// The C defaults are the flags' defaults (docs/CONTRACT.md).
	require.EqualValues(t, 512000, spec.Maps[bpfmaps.IPCacheName].MaxEntries)
	require.EqualValues(t, 16384, spec.Maps[bpfmaps.PolicyName].InnerMap.MaxEntries)
	require.Equal(t, bpfmaps.PolicySubjects, spec.Maps[bpfmaps.PolicyName].MaxEntries)
	require.Equal(t, bpfmaps.EndpointsSpec().MaxEntries, spec.Maps[bpfmaps.EndpointsName].MaxEntries)
	inner, want := spec.Maps[bpfmaps.PolicyName].InnerMap, bpfmaps.PolicySpec(1)
	require.Equal(t, want.Type, inner.Type)
	require.Equal(t, want.KeySize, inner.KeySize)
	require.Equal(t, want.ValueSize, inner.ValueSize)
	require.Equal(t, want.Flags, inner.Flags)
	require.EqualValues(t, bpfmaps.DefaultConntrackMaxEntries, spec.Maps[bpfmaps.ConntrackName].MaxEntries)
	// The program's timeouts are Cilium's defaults: cilium-agent's
	// --bpf-ct-timeout-regular-tcp-syn (1m), -regular-tcp (6h),
	// -regular-tcp-fin (10s) and -regular-any (1m), as its command
	// reference (Documentation/cmdref/cilium-agent.md) gives them.
	for name, want := range map[string]time.Duration{
		bpf.EnforceVarCtTimeoutTcpOpening:     time.Minute,
		bpf.EnforceVarCtTimeoutTcpEstablished: 6 * time.Hour,
		bpf.EnforceVarCtTimeoutTcpClosing:     10 * time.Second,
		bpf.EnforceVarCtTimeoutOther:          time.Minute,
	} {
		var got uint64
		require.NoError(t, spec.Variables[name].Get(&got), name)
		require.EqualValues(t, want, got, name)
	}

	require.Equal(t, ebpf.AttachTCXIngress, spec.Programs[bpf.EnforceProgEnforceFromEndpoint].AttachType)
	require.Equal(t, ebpf.AttachTCXEgress, spec.Programs[bpf.EnforceProgEnforceToEndpoint].AttachType)
}

// maxVerifiedInstructions bounds the instructions the verifier processes
// for each entry point, the kernel's own statistic of what a load costs.
// parse and icmp_error_verdict are global functions, which it checks once
// each; inlined, everything after them was checked again for each way a
// packet could have been parsed, and every agent start paid for it in
// kernel time (docs/SCALE.md, "The verifier's share"). The bound catches a
// change that brings that back long before the kernel's limit does.
const maxVerifiedInstructions = 100_000

var verifiedInstructions = regexp.MustCompile(`processed (\d+) insns`)

func TestPrivilegedEnforceVerifierCost(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	e, err := loadEnforcerWith(newTestEnforcerMaps(t), ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	for name, prog := range map[string]*ebpf.Program{
		bpf.EnforceProgEnforceFromEndpoint: e.fromEndpoint,
		bpf.EnforceProgEnforceToEndpoint:   e.toEndpoint,
	} {
		m := verifiedInstructions.FindStringSubmatch(prog.VerifierLog)
		require.NotNil(t, m, "%s: no statistics in the verifier's log:\n%s", name, prog.VerifierLog)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		t.Logf("%s: %s", name, strings.ReplaceAll(strings.TrimSpace(prog.VerifierLog), "\n", "; "))
		require.LessOrEqual(t, n, maxVerifiedInstructions, "%s: instructions the verifier processed", name)
	}
}

// The two programs are loaded at once (loadPrograms), each from its own
// copy of the spec: they must still share every map, the program's own
// (the events ring, the fragments, the .bss) as well as the agent's.
func TestPrivilegedProgramsShareTheirMaps(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	e, err := loadEnforcer(newTestEnforcerMaps(t))
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	byName := func(p *ebpf.Program) map[string]ebpf.MapID {
		info, err := p.Info()
		require.NoError(t, err)
		ids, ok := info.MapIDs()
		require.True(t, ok, "the kernel does not say a program's maps")
		names := map[string]ebpf.MapID{}
		for _, id := range ids {
			m, err := ebpf.NewMapFromID(id)
			require.NoError(t, err)
			mi, err := m.Info()
			m.Close()
			require.NoError(t, err)
			names[mi.Name] = id
		}
		return names
	}
	from, to := byName(e.fromEndpoint), byName(e.toEndpoint)
	shared := 0
	for name, id := range from {
		if other, ok := to[name]; ok {
			require.Equal(t, id, other, "map %s: each program has its own", name)
			shared++
		}
	}
	events, err := e.events.Info()
	require.NoError(t, err)
	eventsID, _ := events.ID()
	require.Equal(t, eventsID, from["events"], "the enforcer's events ring is not the program's")
	require.Equal(t, eventsID, to["events"], "the enforcer's events ring is not the program's")
	require.GreaterOrEqual(t, shared, 10, "maps used by both programs: %v and %v", from, to)
}

func TestCounterIndex(t *testing.T) {
	t.Parallel()
	// bpfmaps/abi.go: direction*8 + slot; slot 0 allowed, a drop's slot its reason.
	require.Equal(t, uint32(0), counterIndex(policy.Ingress, countAllowed))
	require.Equal(t, uint32(1), counterIndex(policy.Ingress, uint32(bpfmaps.ReasonNoPolicy)))
	require.Equal(t, uint32(6), counterIndex(policy.Ingress, uint32(bpfmaps.ReasonFragment)))
	require.Equal(t, uint32(8), counterIndex(policy.Egress, countAllowed))
	require.Equal(t, uint32(9), counterIndex(policy.Egress, uint32(bpfmaps.ReasonNoPolicy)))
	require.Equal(t, uint32(10), counterIndex(policy.Egress, uint32(bpfmaps.ReasonMalformed)))
	require.Equal(t, uint32(12), counterIndex(policy.Egress, uint32(bpfmaps.ReasonVLANTagged)))
	for _, r := range bpfmaps.DropReasons() {
		require.Less(t, uint32(r), uint32(countersSlots), "reason %s has no slot", r)
	}
}

// newTestEnforcerMaps creates unpinned maps from the agent's specs, with
// max entries other than the C defaults, as configuration may set them.
func newTestEnforcerMaps(t *testing.T) enforcerMaps {
	t.Helper()
	newMap := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		require.NoError(t, err, spec.Name)
		t.Cleanup(func() { m.Close() })
		return m
	}
	return withSubjects(t, enforcerMaps{
		IPCache:     newMap(bpfmaps.IPCacheSpec(1024)),
		Policy:      newMap(bpfmaps.PolicySpec(512)),
		Enforcement: newMap(bpfmaps.EnforcementSpec()),
		Counters:    newMap(bpfmaps.CountersSpec()),
		Conntrack:   newMap(bpfmaps.ConntrackSpec(4096)),
		Revision:    newMap(bpfmaps.RevisionSpec()),

		ConntrackOpening: newMap(bpfmaps.ConntrackOpeningSpec(1024)),
	})
}

// withSubjects adds to maps an empty endpoints map and the outer policy
// map, with maps.Policy as the host-wide default's map in it, and a
// dns-proxy map without a proxy, as the agent opens them (bpfmaps.Open).
func withSubjects(tb testing.TB, maps enforcerMaps) enforcerMaps {
	tb.Helper()
	var err error
	maps.DNSProxy, err = ebpf.NewMap(bpfmaps.DNSProxySpec())
	require.NoError(tb, err)
	tb.Cleanup(func() { maps.DNSProxy.Close() })
	maps.DNSAnswers, err = ebpf.NewMap(bpfmaps.DNSAnswersSpec())
	require.NoError(tb, err)
	tb.Cleanup(func() { maps.DNSAnswers.Close() })
	maps.DNSAnswersLost, err = ebpf.NewMap(bpfmaps.DNSAnswersLostSpec())
	require.NoError(tb, err)
	tb.Cleanup(func() { maps.DNSAnswersLost.Close() })
	maps.Endpoints, err = ebpf.NewMap(bpfmaps.EndpointsSpec())
	require.NoError(tb, err)
	tb.Cleanup(func() { maps.Endpoints.Close() })
	maps.Policies, err = ebpf.NewMap(bpfmaps.PoliciesSpec(maps.Policy.MaxEntries()))
	require.NoError(tb, err)
	tb.Cleanup(func() { maps.Policies.Close() })
	require.NoError(tb, maps.Policies.Put(uint32(0), maps.Policy))
	return maps
}

// bumpRevision does what the agent does after each write to the ipcache,
// policy or enforcement map (revision.go): the tests that write those
// maps directly stand for the agent.
func bumpRevision(tb testing.TB, maps enforcerMaps) {
	tb.Helper()
	r, err := newRevisionCounter(maps.Revision)
	require.NoError(tb, err)
	r.bump()
	require.NoError(tb, r.Close())
}

// newTestLinksDir returns a links directory on a private bpffs mount, which
// is unmounted (releasing every pin in it) when the test ends.
func newTestLinksDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, unix.Mount("bpf", root, "bpf", 0, "mode=0700"))
	t.Cleanup(func() {
		if err := unix.Unmount(root, 0); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
	return bpfmaps.LinksDir(root)
}

// bpfRootOf is the bpffs root of a newTestLinksDir.
func bpfRootOf(linksDir string) string { return filepath.Dir(filepath.Dir(linksDir)) }

func loadTestEnforcer(t *testing.T, maps enforcerMaps) *enforcer {
	t.Helper()
	e, err := loadEnforcer(maps)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

func (nw *endpointNetwork) attach(t *testing.T, e *enforcer, linksDir string) {
	t.Helper()
	require.NoError(t, inNetns(t, nw.host, func() error { return e.attach(nw.hostDevice, linksDir) }))
}

func putIdentity(t *testing.T, maps enforcerMaps, prefix string, id uint32) {
	t.Helper()
	require.NoError(t, maps.IPCache.Put(bpfmaps.NewIPCacheKey(netip.MustParsePrefix(prefix)), bpfmaps.NewIPCacheValue(identity.Number(id))))
	bumpRevision(t, maps)
}

func putAllow(t *testing.T, maps enforcerMaps, identity uint32, direction policy.Direction, protocol uint8, dport uint16) {
	t.Helper()
	require.NoError(t, maps.Policy.Put(policyMapKey(identity, uint8(direction), protocol, dport), bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))))
	bumpRevision(t, maps)
}

func clearPolicyMap(t *testing.T, maps enforcerMaps) {
	t.Helper()
	var keys []bpfmaps.PolicyKey
	var k bpfmaps.PolicyKey
	var v bpfmaps.PolicyValue
	it := maps.Policy.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	require.NoError(t, it.Err())
	for _, k := range keys {
		require.NoError(t, maps.Policy.Delete(k))
	}
	bumpRevision(t, maps)
}

func putEnforced(t *testing.T, maps enforcerMaps, direction policy.Direction, enforced bool) {
	t.Helper()
	var v uint32
	if enforced {
		v = 1
	}
	require.NoError(t, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(0, direction), v))
	bumpRevision(t, maps)
}

func readTestCounters(t *testing.T, maps enforcerMaps) bpfmaps.Counters {
	t.Helper()
	c, err := bpfmaps.ReadCounters(maps.Counters)
	require.NoError(t, err)
	return c
}

// reachable pings each address once and returns which answered. The
// endpoint's neighbour cache is flushed first, so that IPv6 neighbour
// discovery must pass the program again.
func (nw *endpointNetwork) reachable(t *testing.T, addrs ...string) map[string]bool {
	t.Helper()
	ipCmd(t, "-n", nw.ep, "neigh", "flush", "dev", testEPDevice)
	got := map[string]bool{}
	for _, a := range addrs {
		got[a] = nw.pingOnce(t, a)
	}
	return got
}

// The endpoint pings addresses of its peer through the host-side device the
// program is attached to; which answer depends only on the maps.
func TestPrivilegedEnforcementByIdentity(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	const (
		allowed4, denied4, world4 = "10.200.0.2", "10.200.0.3", "10.200.0.4"
		allowed6, denied6         = "fd00:200::2", "fd00:200::3"
	)
	all := []string{allowed4, denied4, world4, allowed6, denied6}
	nw := newEndpointNetwork(t, all...)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, allowed4+"/32", testIdentityAllowed)
	putIdentity(t, maps, denied4+"/32", testIdentityDenied)
	// Longest prefix: ::2 has its own entry inside the /64 of the denied.
	putIdentity(t, maps, "fd00:200::/64", testIdentityDenied)
	putIdentity(t, maps, allowed6+"/128", testIdentityAllowed)
	// world4 is in no entry: identity world.

	nw.attach(t, loadTestEnforcer(t, maps), newTestLinksDir(t))

	t.Run("no direction enforced: everything passes, counted as allowed", func(t *testing.T) {
		before := readTestCounters(t, maps)
		got := nw.reachable(t, all...)
		for _, a := range all {
			require.True(t, got[a], "%s not reachable without enforcement", a)
		}
		after := readTestCounters(t, maps)
		require.GreaterOrEqual(t, after.EgressAllowed-before.EgressAllowed, uint64(len(all)))
		require.GreaterOrEqual(t, after.IngressAllowed-before.IngressAllowed, uint64(len(all)))
		require.Zero(t, after.EgressDropped)
		require.Zero(t, after.IngressDropped)
	})

	t.Run("egress enforced: destination identity decides", func(t *testing.T) {
		putEnforced(t, maps, policy.Egress, true)
		putAllow(t, maps, testIdentityAllowed, policy.Egress, 0, 0)
		t.Cleanup(func() { putEnforced(t, maps, policy.Egress, false); clearPolicyMap(t, maps) })

		before := readTestCounters(t, maps)
		require.Equal(t, map[string]bool{
			allowed4: true, denied4: false, world4: false, allowed6: true, denied6: false,
		}, nw.reachable(t, all...))
		after := readTestCounters(t, maps)
		require.GreaterOrEqual(t, after.EgressDropped-before.EgressDropped, uint64(3))
		require.GreaterOrEqual(t, after.EgressAllowed-before.EgressAllowed, uint64(2))
		require.Zero(t, after.IngressDropped-before.IngressDropped)

		// An address in no ipcache entry is world.
		putAllow(t, maps, testIdentityWorld, policy.Egress, 0, 0)
		require.True(t, nw.pingOnce(t, world4))
		require.False(t, nw.pingOnce(t, denied4))
	})

	t.Run("ingress enforced: source identity decides", func(t *testing.T) {
		putEnforced(t, maps, policy.Ingress, true)
		putAllow(t, maps, testIdentityAllowed, policy.Ingress, 0, 0)
		// An egress rule must not allow ingress.
		putAllow(t, maps, testIdentityDenied, policy.Egress, 0, 0)
		t.Cleanup(func() { putEnforced(t, maps, policy.Ingress, false); clearPolicyMap(t, maps) })

		// The endpoint's own pings are tracked at egress (not enforced,
		// but ingress is): their replies pass whatever their source.
		got := nw.reachable(t, all...)
		for _, a := range all {
			require.True(t, got[a], "reply from %s dropped", a)
		}
		// Requests toward the endpoint are decided by their source.
		before := readTestCounters(t, maps)
		require.Equal(t, map[string]bool{
			allowed4: true, denied4: false, world4: false, allowed6: true, denied6: false,
		}, nw.reachableFromHost(t, all...))
		after := readTestCounters(t, maps)
		require.GreaterOrEqual(t, after.IngressDropped-before.IngressDropped, uint64(3))
		require.Zero(t, after.EgressDropped-before.EgressDropped)
	})

	t.Run("ports and protocols", func(t *testing.T) {
		const openPort, closedPort, udpPort = 8080, 8081, 5353
		addrPort := func(port int) string {
			return netip.AddrPortFrom(netip.MustParseAddr(allowed4), uint16(port)).String()
		}
		var tcpOpen, tcpClosed net.Listener
		var udp net.PacketConn
		require.NoError(t, inNetns(t, nw.host, func() (err error) {
			if tcpOpen, err = net.Listen("tcp", addrPort(openPort)); err != nil {
				return err
			}
			if tcpClosed, err = net.Listen("tcp", addrPort(closedPort)); err != nil {
				return err
			}
			udp, err = net.ListenPacket("udp", addrPort(udpPort))
			return err
		}))
		t.Cleanup(func() { tcpOpen.Close(); tcpClosed.Close(); udp.Close() })
		for _, l := range []net.Listener{tcpOpen, tcpClosed} {
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		dial := func(port int) error {
			return inNetns(t, nw.ep, func() error {
				c, err := net.DialTimeout("tcp", addrPort(port), time.Second)
				if err == nil {
					c.Close()
				}
				return err
			})
		}
		udpArrives := func() bool {
			require.NoError(t, inNetns(t, nw.ep, func() error {
				c, err := net.Dial("udp", addrPort(udpPort))
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("probe"))
				return err
			}))
			require.NoError(t, udp.SetReadDeadline(time.Now().Add(time.Second)))
			buf := make([]byte, 16)
			n, _, err := udp.ReadFrom(buf)
			return err == nil && string(buf[:n]) == "probe"
		}

		putEnforced(t, maps, policy.Egress, true)
		putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoTCP, openPort)
		t.Cleanup(func() { putEnforced(t, maps, policy.Egress, false); clearPolicyMap(t, maps) })

		require.NoError(t, dial(openPort), "TCP to the allowed port")
		require.Error(t, dial(closedPort), "TCP to another port")
		require.False(t, udpArrives(), "UDP with only a TCP rule")
		require.False(t, nw.pingOnce(t, allowed4), "ICMP with only a TCP rule")

		// A protocol rule without port allows every port of that protocol.
		putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoUDP, 0)
		require.True(t, udpArrives(), "UDP with a UDP rule for any port")
		require.Error(t, dial(closedPort), "a UDP rule must not allow TCP")

		// A rule without protocol allows everything.
		putAllow(t, maps, testIdentityAllowed, policy.Egress, 0, 0)
		require.NoError(t, dial(closedPort))
		require.True(t, nw.pingOnce(t, allowed4))
	})
}

// pinnedLinkInfo returns the link pinned at pin: its ID, its program's ID
// and its ifindex.
func pinnedLinkInfo(t *testing.T, pin string) (link.ID, ebpf.ProgramID, uint32) {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	require.NoError(t, err)
	defer l.Close()
	info, err := l.Info()
	require.NoError(t, err)
	require.NotNil(t, info.TCX(), "%s is not a TCX link", pin)
	return info.ID, info.Program, info.TCX().Ifindex
}

func programID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	require.NoError(t, err)
	id, ok := info.ID()
	require.True(t, ok)
	return id
}

// An agent restart attaches a newly loaded program over the pinned links:
// the links stay, their program is swapped, and no packet sees a moment
// without enforcement. The links keep enforcing after the agent lets go.
func TestPrivilegedAttachUpdatesPinnedLinksInPlace(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	const allowed4, denied4 = "10.200.0.2", "10.200.0.3"
	nw := newEndpointNetwork(t, allowed4, denied4)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, allowed4+"/32", testIdentityAllowed)
	putIdentity(t, maps, denied4+"/32", testIdentityDenied)
	putEnforced(t, maps, policy.Egress, true)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, 0, 0)
	linksDir := newTestLinksDir(t)
	ingressPin := filepath.Join(linksDir, testHostDevice+"-ingress")
	egressPin := filepath.Join(linksDir, testHostDevice+"-egress")

	first, err := loadEnforcer(maps)
	require.NoError(t, err)
	nw.attach(t, first, linksDir)
	st, err := os.Stat(linksDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	ingressLink, ingressProg, _ := pinnedLinkInfo(t, ingressPin)
	egressLink, egressProg, _ := pinnedLinkInfo(t, egressPin)
	require.Equal(t, programID(t, first.fromEndpoint), ingressProg)
	require.Equal(t, programID(t, first.toEndpoint), egressProg)
	require.False(t, nw.pingOnce(t, denied4))

	// Continuous pings across the restart: 150 requests each, 20ms apart.
	const count = 150
	var wg sync.WaitGroup
	var allowedAnswers, deniedAnswers int
	wg.Go(func() { allowedAnswers = nw.ping(t, allowed4, count, "0.02") })
	wg.Go(func() { deniedAnswers = nw.ping(t, denied4, count, "0.02") })

	time.Sleep(time.Second)
	// The "restart": the old agent's references go, a new one attaches.
	require.NoError(t, first.Close())
	second := loadTestEnforcer(t, maps)
	nw.attach(t, second, linksDir)
	wg.Wait()

	require.Equal(t, count, allowedAnswers, "allowed traffic lost across the update")
	require.Zero(t, deniedAnswers, "denied traffic passed across the update")

	gotIngressLink, gotIngressProg, _ := pinnedLinkInfo(t, ingressPin)
	gotEgressLink, gotEgressProg, _ := pinnedLinkInfo(t, egressPin)
	require.Equal(t, ingressLink, gotIngressLink, "ingress link replaced instead of updated")
	require.Equal(t, egressLink, gotEgressLink, "egress link replaced instead of updated")
	require.Equal(t, programID(t, second.fromEndpoint), gotIngressProg)
	require.Equal(t, programID(t, second.toEndpoint), gotEgressProg)

	// The agent exits: the pinned links keep the program and keep enforcing.
	require.NoError(t, second.Close())
	require.False(t, nw.pingOnce(t, denied4))
	require.True(t, nw.pingOnce(t, allowed4))
}

// A pinned link whose device went away is replaced when the device is back.
func TestPrivilegedAttachReplacesStaleLink(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	const denied4 = "10.200.0.3"
	nw := newEndpointNetwork(t, denied4)
	maps := newTestEnforcerMaps(t)
	putEnforced(t, maps, policy.Egress, true) // no rules: everything dropped
	linksDir := newTestLinksDir(t)
	ingressPin := filepath.Join(linksDir, testHostDevice+"-ingress")
	e := loadTestEnforcer(t, maps)

	nw.attach(t, e, linksDir)
	oldLink, _, oldIfindex := pinnedLinkInfo(t, ingressPin)
	require.False(t, nw.pingOnce(t, denied4))

	nw.deleteVeth(t)
	_, _, ifindex := pinnedLinkInfo(t, ingressPin)
	require.Zero(t, ifindex, "link of a deleted device should be defunct")
	nw.createVeth(t)
	require.True(t, nw.pingOnce(t, denied4), "new device has no program yet")

	nw.attach(t, e, linksDir)
	newLink, _, newIfindex := pinnedLinkInfo(t, ingressPin)
	require.NotEqual(t, oldLink, newLink)
	require.NotEqual(t, oldIfindex, newIfindex)
	require.False(t, nw.pingOnce(t, denied4))
	entries, err := os.ReadDir(linksDir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "only the two pins remain")

	// The device is renamed and another takes its name: the pinned links are
	// alive but on the wrong device. They are replaced, and detached from the
	// renamed device.
	ipCmd(t, "-n", nw.host, "link", "set", nw.hostDevice, "down")
	ipCmd(t, "-n", nw.host, "link", "set", nw.hostDevice, "name", "renamed0")
	ipCmd(t, "-n", nw.host, "link", "add", nw.hostDevice, "type", "veth", "peer", "name", "other0")
	nw.attach(t, e, linksDir)
	_, _, ifindex = pinnedLinkInfo(t, ingressPin)
	require.Equal(t, uint32(nw.ifindex(t, nw.hostDevice)), ifindex)
	require.Zero(t, nw.attachedPrograms(t, "renamed0"), "links left on the renamed device")
	require.Equal(t, 2, nw.attachedPrograms(t, nw.hostDevice))
}

func TestPrivilegedDetachAllLeavesNoPin(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	const denied4 = "10.200.0.3"
	nw := newEndpointNetwork(t, denied4)
	maps := newTestEnforcerMaps(t)
	putEnforced(t, maps, policy.Egress, true)
	linksDir := newTestLinksDir(t)
	e := loadTestEnforcer(t, maps)
	nw.attach(t, e, linksDir)
	require.False(t, nw.pingOnce(t, denied4))
	require.Equal(t, 2, nw.attachedPrograms(t, nw.hostDevice))

	removed, err := bpfmaps.Cleanup(bpfRootOf(linksDir))
	require.NoError(t, err)
	require.Equal(t, []string{nw.hostDevice}, removed.Devices)
	_, err = os.Stat(linksDir)
	require.True(t, errors.Is(err, os.ErrNotExist), "links directory still there: %v", err)
	require.Zero(t, nw.attachedPrograms(t, nw.hostDevice))
	// The program still exists (the agent holds it) but nothing runs it.
	require.True(t, nw.pingOnce(t, denied4))

	removed, err = bpfmaps.Cleanup(bpfRootOf(linksDir))
	require.NoError(t, err, "nothing to detach is not an error")
	require.Empty(t, removed.Devices)
}

func TestPrivilegedAttachRefusesNonEthernet(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t)
	e := loadTestEnforcer(t, newTestEnforcerMaps(t))
	linksDir := newTestLinksDir(t)
	err := inNetns(t, nw.host, func() error { return e.attach("lo", linksDir) })
	require.ErrorContains(t, err, "not an Ethernet device")
	err = inNetns(t, nw.host, func() error { return e.attach("missing0", linksDir) })
	require.Error(t, err)
	_, err = os.Stat(linksDir)
	require.True(t, errors.Is(err, os.ErrNotExist), "nothing pinned for a refused device")
}

func TestLinkPinName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "host0-ingress", linkPinName("host0", "ingress"))
	require.Equal(t, "eth0%100-egress", linkPinName("eth0.100", "egress"))
}

// bpffs refuses '.' in names; a VLAN-style device name must still work.
func TestPrivilegedAttachDeviceNameWithDot(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t)
	ipCmd(t, "-n", nw.host, "link", "add", "vl.10", "type", "veth", "peer", "name", "vl.11")
	ipCmd(t, "-n", nw.host, "link", "set", "vl.10", "up")
	e := loadTestEnforcer(t, newTestEnforcerMaps(t))
	linksDir := newTestLinksDir(t)
	require.NoError(t, inNetns(t, nw.host, func() error { return e.attach("vl.10", linksDir) }))
	pinnedLinkInfo(t, filepath.Join(linksDir, "vl%10-ingress"))
	pinnedLinkInfo(t, filepath.Join(linksDir, "vl%10-egress"))
	removed, err := bpfmaps.Cleanup(bpfRootOf(linksDir))
	require.NoError(t, err)
	require.Equal(t, []string{"vl.10"}, removed.Devices, "the device's name, not the pin's")
}

// fixedVerdictProgram is a TCX program that returns verdict for every packet.
func fixedVerdictProgram(t *testing.T, verdict int32) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		AttachType:   ebpf.AttachTCXIngress,
		License:      "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, verdict), asm.Return()},
	})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// The program runs before programs attached earlier (so none of them can
// accept a packet policy drops), and its allow leaves the decision to the
// programs after it.
func TestPrivilegedProgramPlaceInTheTCXChain(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	const allowed4, denied4 = "10.200.0.2", "10.200.0.3"
	const tcxPass, tcxDrop = 0, 2
	nw := newEndpointNetwork(t, allowed4, denied4)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, allowed4+"/32", testIdentityAllowed)
	putEnforced(t, maps, policy.Egress, true)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, 0, 0)

	attachFixed := func(verdict int32) link.Link {
		var l link.Link
		require.NoError(t, inNetns(t, nw.host, func() error {
			iface, err := net.InterfaceByName(nw.hostDevice)
			if err != nil {
				return err
			}
			l, err = link.AttachTCX(link.TCXOptions{
				Interface: iface.Index,
				Program:   fixedVerdictProgram(t, verdict),
				Attach:    ebpf.AttachTCXIngress,
				Anchor:    link.Tail(),
			})
			return err
		}))
		return l
	}

	pass := attachFixed(tcxPass)
	require.True(t, nw.pingOnce(t, denied4), "accepted by the earlier program")
	nw.attach(t, loadTestEnforcer(t, maps), newTestLinksDir(t))
	require.False(t, nw.pingOnce(t, denied4), "the earlier program accepted a packet policy drops")
	require.True(t, nw.pingOnce(t, allowed4))
	require.NoError(t, pass.Close())

	drop := attachFixed(tcxDrop)
	defer drop.Close()
	require.False(t, nw.pingOnce(t, allowed4), "policy's allow overrode a later program's drop")
}
