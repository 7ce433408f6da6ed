// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The per-packet cost of enforcement, measured with BPF_PROG_RUN on
// crafted packets against maps holding 100k ipcache entries:
//
//	go test -run '^$' -bench EnforcementPerPacket -benchtime=1x ./datapathcell/
//
// The stateless baseline is the program as it was before connection
// tracking (testdata/enforce_stateless_bpfel.o, the committed object of
// that time), run on the same maps. Each case's ratio is to a run of the
// pass-through program just before it, so that load on a shared machine
// that comes and goes within a round moves both alike; -benchtime=Nx runs
// N times benchRounds rounds.
//
// To compare with an earlier build of the program in the same run, name its
// object in IPCACHE_AGENT_BENCH_BEFORE, e.g. the object of a commit:
//
//	git show COMMIT:datapathcell/bpf/enforce_bpfel.o > /tmp/before.o
//	IPCACHE_AGENT_BENCH_BEFORE=/tmp/before.o go test -run '^$' -bench EnforcementPerPacket -benchtime=1x ./datapathcell/
//
// Its established and not-enforced cases are then measured right after the
// current program's, on the same maps.

const (
	benchIPCacheEntries = 100_000
	benchRepeat         = 1_000_000
	benchRounds         = 5
	// benchAnswerRuns is how many DNS answers are measured recorded: fewer
	// than the dns-answers ring holds.
	benchAnswerRuns = 2000
	// benchNewConnections is how many distinct connections measure a new
	// connection per round, in batches of benchSYNBatch (far fewer than
	// ct_opening holds, so that none evicts another).
	benchNewConnections = 20_000
	benchSYNBatch       = 4000
	benchSYNFirstPort   = 20000
	tcxNextRet          = 0xffffffff // TCX_NEXT (-1)
	tcxDropRet          = 2
)

var (
	benchEndpoint = netip.MustParseAddr("10.0.0.1")
	benchPeer     = netip.MustParseAddr("192.0.2.10")
)

const benchPeerPort, benchEndpointPort = 5978, 40000

// tcpPacket is an Ethernet, IPv4 and TCP header from src to dst.
func tcpPacket(src, dst netip.AddrPort, flags uint8) []byte {
	p := make([]byte, 14+20+20)
	binary.BigEndian.PutUint16(p[12:14], 0x0800)
	ip := p[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], 40)
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF
	ip[8] = 64
	ip[9] = testProtoTCP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	tcp := p[34:]
	binary.BigEndian.PutUint16(tcp[0:2], src.Port())
	binary.BigEndian.PutUint16(tcp[2:4], dst.Port())
	tcp[12] = 0x50
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:16], 65535)
	return p
}

// benchMaps are maps of the agent's specs with 100k /32s in the ipcache,
// the peer among them, egress rules (benchPolicyRules) in the host-wide
// default's policy map, one of which allows the peer on TCP
// benchPeerPort, and other endpoints than benchEndpoint in the endpoints
// map.
func benchMaps(tb testing.TB) enforcerMaps {
	tb.Helper()
	newMap := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		require.NoError(tb, err, spec.Name)
		tb.Cleanup(func() { m.Close() })
		return m
	}
	maps := withSubjects(tb, enforcerMaps{
		IPCache:     newMap(bpfmaps.IPCacheSpec(benchIPCacheEntries + 1)),
		Policy:      newMap(bpfmaps.PolicySpec(16384)),
		Enforcement: newMap(bpfmaps.EnforcementSpec()),
		Counters:    newMap(bpfmaps.CountersSpec()),
		Conntrack:   newMap(bpfmaps.ConntrackSpec(262144)),

		ConntrackOpening: newMap(bpfmaps.ConntrackOpeningSpec(65536)),
		Revision:         newMap(bpfmaps.RevisionSpec()),
	})
	rng := rand.New(rand.NewPCG(1, 1))
	seen := map[netip.Addr]bool{benchPeer: true, benchEndpoint: true}
	keys := []bpfmaps.IPCacheKey{bpfmaps.NewIPCacheKey(netip.PrefixFrom(benchPeer, 32))}
	values := []bpfmaps.IPCacheValue{bpfmaps.NewIPCacheValue(testIdentityAllowed)}
	for len(keys) < benchIPCacheEntries {
		a := netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, rng.Uint32())))
		if seen[a] {
			continue
		}
		seen[a] = true
		keys = append(keys, bpfmaps.NewIPCacheKey(netip.PrefixFrom(a, 32)))
		values = append(values, bpfmaps.NewIPCacheValue(identity.Number(testIdentityDenied+uint32(len(keys)%1000))))
	}
	_, err := maps.IPCache.BatchUpdate(keys, values, nil)
	require.NoError(tb, err)
	for _, r := range benchPolicyRules() {
		require.NoError(tb, maps.Policy.Put(policyMapKey(r.identity, uint8(policy.Egress), r.protocol, r.port), bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))))
	}
	// Other local endpoints (benchEndpoints): every packet looks its
	// endpoint up among them, and the benchmark's is the default's.
	var epKeys []bpfmaps.EndpointKey
	var epValues []bpfmaps.EndpointValue
	for i := range benchEndpoints {
		epKeys = append(epKeys, bpfmaps.NewEndpointKey(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})))
		epValues = append(epValues, bpfmaps.NewEndpointValue(identity.MinCluster+identity.Number(i%100), 0))
	}
	_, err = maps.Endpoints.BatchUpdate(epKeys, epValues, nil)
	require.NoError(tb, err)
	bumpRevision(tb, maps)
	return maps
}

// benchEndpoints is how many local endpoints the endpoints map holds.
const benchEndpoints = 1000

// benchSubject is benchEndpoint's identity when it is in the endpoints
// map (withEndpoint in BenchmarkEnforcementPerPacket).
const benchSubject = identity.MinCluster + 7

// benchPolicyRule is an egress allow of the benchmark's policy map.
type benchPolicyRule struct {
	identity uint32
	protocol uint8
	port     uint16
}

// benchPolicyRules: the peer's rule among rules of 1000 other identities
// and 20 for any identity (identity 0), so that the trie's lookups walk a
// trie of some depth, as with real policies.
func benchPolicyRules() []benchPolicyRule {
	rules := []benchPolicyRule{{testIdentityAllowed, testProtoTCP, benchPeerPort}}
	for i := range 1000 {
		rules = append(rules, benchPolicyRule{testIdentityDenied + uint32(i), testProtoTCP, uint16(80 + i%50)})
	}
	for i := range 20 {
		rules = append(rules, benchPolicyRule{0, testProtoUDP, uint16(1000 + i)})
	}
	return rules
}

func setEnforced(tb testing.TB, maps enforcerMaps, ingress, egress bool) {
	tb.Helper()
	for d, on := range map[uint32]bool{uint32(policy.Ingress): ingress, uint32(policy.Egress): egress} {
		var v uint32
		if on {
			v = 1
		}
		require.NoError(tb, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Direction(d)), v))
	}
	bumpRevision(tb, maps)
}

// runPerPacket runs prog on pkt repeat times in the kernel and returns the
// time per run, checking the verdict.
func runPerPacket(tb testing.TB, prog *ebpf.Program, pkt []byte, repeat int, want uint32) time.Duration {
	tb.Helper()
	ret, d, err := prog.Benchmark(pkt, repeat, nil)
	require.NoError(tb, err)
	require.Equal(tb, want, ret, "verdict")
	return d
}

func BenchmarkEnforcementPerPacket(b *testing.B) {
	privileged.Test(b)
	maps := benchMaps(b)
	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	const syn, ack = 0x02, 0x10
	forwardSYN, forwardACK := tcpPacket(out, peer, syn), tcpPacket(out, peer, ack)
	replyACK := tcpPacket(peer, out, ack)
	key := bpfmaps.NewConntrackKey(progRunIfindex, out, peer, testProtoTCP)
	// The same connection as benchEndpoint's own (endpointScenario): the
	// key holds its subject.
	subjectKey := key
	binary.NativeEndian.PutUint16(subjectKey[38:40], uint16(benchSubject))

	passThrough := passThroughProgram(b)
	stateless, err := ebpf.LoadCollectionSpec(filepath.Join("testdata", "enforce_stateless_bpfel.o"))
	require.NoError(b, err)
	stateless.Maps[bpfmaps.IPCacheName].MaxEntries = maps.IPCache.MaxEntries()
	var old struct {
		FromEndpoint *ebpf.Program `ebpf:"enforce_from_endpoint"`
		ToEndpoint   *ebpf.Program `ebpf:"enforce_to_endpoint"`
	}
	// An object of an older counters layout (packets only) counts in a map
	// of its own: the counts are not what is measured.
	shareCounters := func(spec *ebpf.CollectionSpec, replacements map[string]*ebpf.Map) {
		if c := spec.Maps[bpfmaps.CountersName]; c.ValueSize == maps.Counters.ValueSize() && c.MaxEntries == maps.Counters.MaxEntries() {
			replacements[bpfmaps.CountersName] = maps.Counters
		}
	}
	// An object of the previous policy map layout (a hash) gets a map of
	// that layout with the same rule.
	hashPolicy := newHashPolicyMap(b, benchPolicyRules())
	// One of the flat LPM layout gets the default's map, one of subjects
	// the outer map (whose default's map it is).
	policyFor := func(spec *ebpf.CollectionSpec) *ebpf.Map {
		switch spec.Maps[bpfmaps.PolicyName].Type {
		case ebpf.Hash:
			return hashPolicy
		case ebpf.HashOfMaps:
			return maps.Policies
		}
		return maps.Policy
	}
	// Objects before subjects (an array of the default's two directions)
	// get one of that size, which enforce keeps as the current program's.
	arrayEnforcement, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	require.NoError(b, err)
	b.Cleanup(func() { arrayEnforcement.Close() })
	enforcementFor := func(spec *ebpf.CollectionSpec) *ebpf.Map {
		if spec.Maps[bpfmaps.EnforcementName].MaxEntries == arrayEnforcement.MaxEntries() {
			return arrayEnforcement
		}
		return maps.Enforcement
	}
	enforce := func(ingress, egress bool) {
		setEnforced(b, maps, ingress, egress)
		for d, on := range []bool{ingress, egress} {
			var v uint32
			if on {
				v = 1
			}
			require.NoError(b, arrayEnforcement.Put(uint32(d), v))
		}
	}
	statelessMaps := map[string]*ebpf.Map{
		bpfmaps.IPCacheName: maps.IPCache, bpfmaps.PolicyName: policyFor(stateless), bpfmaps.EnforcementName: enforcementFor(stateless),
	}
	shareCounters(stateless, statelessMaps)
	require.NoError(b, stateless.LoadAndAssign(&old, &ebpf.CollectionOptions{MapReplacements: statelessMaps}))
	b.Cleanup(func() { old.FromEndpoint.Close(); old.ToEndpoint.Close() })
	enf, err := loadEnforcer(maps)
	require.NoError(b, err)
	b.Cleanup(func() { enf.Close() })
	// As the endpoints writer tells the program: the slots of the map's
	// addresses are looked up, the others skipped (benchEndpoint's slot is
	// none of theirs, which TestEndpointSlots checks).
	var inMap []bpfmaps.EndpointKey
	require.NoError(b, bpfmaps.ReadEntries(maps.Endpoints, func(k bpfmaps.EndpointKey, _ bpfmaps.EndpointValue) { inMap = append(inMap, k) }))
	filter := absentExcept(slices.Values(inMap))
	require.NoError(b, enf.endpointAbsent.Set(filter))
	// And the words of their IPv4 addresses (endpoint_words), to the
	// earlier program as well if it has them.
	withWords := []*enforcer{enf}
	setWords := func() {
		entries := map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{}
		require.NoError(b, bpfmaps.ReadEntries(maps.Endpoints, func(k bpfmaps.EndpointKey, v bpfmaps.EndpointValue) { entries[k] = v }))
		for _, e := range withWords {
			require.NoError(b, e.setEndpointWords(endpointWordsOf(entries)))
		}
	}
	setWords()
	// A DNS query the peer's rule of verdict 3 allows, and a socket for
	// the program to find on the proxy's port (no packet reaches it:
	// BPF_PROG_RUN delivers nothing).
	dnsQuery := frame4(benchEndpoint, benchPeer, testProtoUDP, udpHeader(benchEndpointPort, 53, make([]byte, 40)))
	require.NoError(b, maps.Policy.Put(policyMapKey(testIdentityAllowed, uint8(policy.Egress), testProtoUDP, 53),
		bpfmaps.NewPolicyValue(uint32(verdictDNSProxy))))
	bumpRevision(b, maps)
	proxySocket, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	require.NoError(b, err)
	b.Cleanup(func() { proxySocket.Close() })
	dnsAnswer := frame4(benchPeer, benchEndpoint, testProtoUDP, udpHeader(53, benchEndpointPort, make([]byte, 100)))
	answers, err := ringbuf.NewReader(maps.DNSAnswers)
	require.NoError(b, err)
	b.Cleanup(func() { answers.Close() })
	drainAnswers := func() {
		answers.SetDeadline(time.Now())
		for {
			if _, err := answers.Read(); err != nil {
				require.ErrorIs(b, err, os.ErrDeadlineExceeded)
				return
			}
		}
	}
	setDNSProxy := func(port int) {
		require.NoError(b, maps.DNSProxy.Put(uint32(0), bpfmaps.NewDNSProxyValue(uint16(port))))
	}
	// withEndpoint puts benchEndpoint in the endpoints map, bound to the
	// device (with the device's key, as the endpoints writer writes it),
	// as benchSubject, whose direction both are enforced by the rules
	// of the default's map, and tells the program its slots are not
	// absent; or takes it out again.
	epKey, devKey := bpfmaps.NewEndpointKey(benchEndpoint), bpfmaps.NewEndpointDeviceKey(progRunIfindex)
	withEndpoint := func(on bool) {
		if on {
			require.NoError(b, maps.Policies.Put(uint32(benchSubject), maps.Policy))
			for _, d := range policy.Directions() {
				require.NoError(b, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(benchSubject, d), uint32(1)))
			}
			require.NoError(b, maps.Endpoints.Put(epKey, bpfmaps.NewEndpointValue(benchSubject, progRunIfindex)))
			require.NoError(b, maps.Endpoints.Put(devKey, bpfmaps.NewEndpointValue(identity.Unknown, progRunIfindex)))
			require.NoError(b, enf.endpointAbsent.Set(absentExcept(slices.Values(inMap), slices.Values([]bpfmaps.EndpointKey{epKey, devKey}))))
			setWords()
			require.NotZero(b, enf.wordsSet[endpointSlot(epKey)], "benchEndpoint's word")
		} else {
			for _, e := range withWords {
				require.NoError(b, e.setEndpointWords(endpointWords{}))
			}
			require.NoError(b, enf.endpointAbsent.Set(filter))
			require.NoError(b, maps.Endpoints.Delete(devKey))
			require.NoError(b, maps.Endpoints.Delete(epKey))
			setWords()
		}
		bumpRevision(b, maps)
	}
	// IPCACHE_AGENT_BENCH_ONLY, if set, measures only the cases whose name
	// holds it (and pass-through), to measure a change quickly.
	only := os.Getenv("IPCACHE_AGENT_BENCH_ONLY")
	skip := func(name string) bool { return only != "" && !strings.Contains(name, only) }
	var before *enforcer
	// beforeCT is the earlier program's conntrack map when its key is of
	// the previous layout (without the device): the same connection's
	// entry is then kept in both maps alike (ctPut, ctDelete).
	var beforeCT *ebpf.Map
	// beforeOpening is the earlier program's ct_opening when it is its own.
	var beforeOpening *ebpf.Map
	if path := os.Getenv("IPCACHE_AGENT_BENCH_BEFORE"); path != "" {
		spec, err := ebpf.LoadCollectionSpec(path)
		require.NoError(b, err)
		spec.Maps[bpfmaps.IPCacheName].MaxEntries = maps.IPCache.MaxEntries()
		spec.Maps[bpfmaps.ConntrackName].MaxEntries = maps.Conntrack.MaxEntries()
		replacements := map[string]*ebpf.Map{
			bpfmaps.IPCacheName: maps.IPCache, bpfmaps.PolicyName: policyFor(spec), bpfmaps.EnforcementName: enforcementFor(spec),
			bpfmaps.ConntrackName: maps.Conntrack,
		}
		shareCounters(spec, replacements)
		if ct := spec.Maps[bpfmaps.ConntrackName]; ct.KeySize != maps.Conntrack.KeySize() {
			beforeCT, err = ebpf.NewMap(ct)
			require.NoError(b, err)
			b.Cleanup(func() { beforeCT.Close() })
			replacements[bpfmaps.ConntrackName] = beforeCT
		}
		// An object of the same layout with ct_opening shares it, so that
		// the entries a SYN creates are where both programs look.
		if ct := spec.Maps[bpfmaps.ConntrackOpeningName]; ct != nil && ct.KeySize == maps.ConntrackOpening.KeySize() {
			ct.MaxEntries = maps.ConntrackOpening.MaxEntries()
			replacements[bpfmaps.ConntrackOpeningName] = maps.ConntrackOpening
		}
		if _, ok := spec.Maps[bpfmaps.EndpointsName]; ok {
			replacements[bpfmaps.EndpointsName] = maps.Endpoints
		}
		// An object that keeps verdicts shares the revision, so that it
		// trusts what it kept as the current program does.
		if _, ok := spec.Maps[bpfmaps.RevisionName]; ok {
			replacements[bpfmaps.RevisionName] = maps.Revision
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replacements})
		require.NoError(b, err)
		b.Cleanup(coll.Close)
		before = &enforcer{fromEndpoint: coll.Programs["enforce_from_endpoint"], toEndpoint: coll.Programs["enforce_to_endpoint"]}
		// Its own ct_opening, when it does not share ours: the new
		// connections' entries are deleted from it as well.
		if m := coll.Maps[bpfmaps.ConntrackOpeningName]; m != nil && m != maps.ConntrackOpening {
			beforeOpening = m
		}
		if offset, err := variableOffset(spec, ".bss", "endpoint_words"); err == nil {
			// An object with endpoint_words gets them as the current
			// program does (its endpoint_absent stays clear: every slot
			// looked up).
			before.endpointWords, err = mapWords(coll.Maps[".bss"], offset)
			require.NoError(b, err)
			b.Cleanup(func() { before.endpointWords.close() })
			before.wordsSet = endpointWords{}
			withWords = append(withWords, before)
			setWords()
		}
	}
	revision, err := newRevisionCounter(maps.Revision)
	require.NoError(b, err)
	b.Cleanup(func() { revision.Close() })
	// The distinct new connections' SYNs (newConnection), from ports of
	// benchEndpoint other than benchEndpointPort.
	synPackets := make([][]byte, benchSYNBatch)
	for i := range synPackets {
		synPackets[i] = tcpPacket(netip.AddrPortFrom(benchEndpoint, uint16(benchSYNFirstPort+i)), peer, syn)
	}
	// synKey is the key of synPackets[i]'s connection, of the subject
	// key holds.
	synKey := func(i int) bpfmaps.ConntrackKey {
		k := key
		binary.BigEndian.PutUint16(k[32:34], uint16(benchSYNFirstPort+i))
		return k
	}
	// synOpened checks that synPackets[i] opened its connection: the entry
	// is in ct_opening of the program that ran it.
	synOpened := func(prog *ebpf.Program, i int) {
		m, k := maps.ConntrackOpening, synKey(i)
		if before != nil && prog == before.fromEndpoint && beforeOpening != nil {
			m = beforeOpening
		}
		var v bpfmaps.ConntrackValue
		require.NoError(b, m.Lookup(k[:m.KeySize()], &v), "SYN %d created its entry", i)
	}
	// synDelete deletes synPackets' connections, from every map that may
	// hold them.
	synDelete := func() {
		for i := range synPackets {
			k := synKey(i)
			for _, m := range []*ebpf.Map{maps.Conntrack, maps.ConntrackOpening, beforeCT, beforeOpening} {
				if m == nil {
					continue
				}
				if err := m.Delete(k[:m.KeySize()]); err != nil {
					require.ErrorIs(b, err, ebpf.ErrKeyNotExist)
				}
			}
		}
	}
	ctPut := func(v bpfmaps.ConntrackValue) {
		require.NoError(b, maps.Conntrack.Put(key, v))
		if beforeCT != nil {
			require.NoError(b, beforeCT.Put(key[:previousConntrackKeySize], v))
		}
	}
	ctDelete := func() {
		for m, k := range map[*ebpf.Map][]byte{maps.Conntrack: key[:], maps.ConntrackOpening: key[:], beforeCT: key[:previousConntrackKeySize]} {
			if m == nil {
				continue
			}
			if err := m.Delete(k); err != nil {
				require.ErrorIs(b, err, ebpf.ErrKeyNotExist)
			}
		}
		// As the agent does after deleting entries that have not
		// expired (conntrackcell's flush): the program keeps the last
		// connection per CPU (`flows`) while the revision stays.
		bumpRevision(b, maps)
	}
	// addBefore measures the earlier program, if one is given, on the case
	// just measured.
	addBefore := func(add func(string, *ebpf.Program, []byte, uint32), name string, prog func(*enforcer) *ebpf.Program, pkt []byte) {
		if before != nil {
			want := uint32(tcxNextRet)
			if strings.Contains(name, "dropped") {
				want = tcxDropRet
			}
			add("before: "+name, prog(before), pkt, want)
		}
	}
	// setEvents sets what the current program writes to its ring buffer
	// (nobody reads it here: once it is full, or past the rate limit,
	// an event costs the limit's check and the lost counter).
	setEvents := func(kinds events.Kinds) { require.NoError(b, enf.eventsMask.Set(uint32(kinds))) }
	from := func(e *enforcer) *ebpf.Program { return e.fromEndpoint }
	to := func(e *enforcer) *ebpf.Program { return e.toEndpoint }

	type row struct {
		name string
		ns   float64
		base float64 // pass-through measured the same way, just before
	}
	// Rounds measure every case in turn; the table shows each case's
	// median round, so that a burst of load on a shared machine moves
	// no case alone.
	var rounds [][]row
	for range b.N * benchRounds {
		var rows []row
		add := func(name string, prog *ebpf.Program, pkt []byte, want uint32) {
			if skip(name) && len(rows) > 0 {
				// Once, for what the cases after it need (an entry).
				runPerPacket(b, prog, pkt, 1, want)
				return
			}
			base := runPerPacket(b, passThrough, forwardACK, benchRepeat, tcxNextRet)
			d := runPerPacket(b, prog, pkt, benchRepeat, want)
			rows = append(rows, row{name, float64(d.Nanoseconds()), float64(base.Nanoseconds())})
		}
		add("pass-through (TCX_NEXT)", passThrough, forwardACK, tcxNextRet)

		enforce(true, true)
		add("stateless: allowed", old.FromEndpoint, forwardACK, tcxNextRet)
		add("stateless: dropped (the reply)", old.ToEndpoint, replyACK, tcxDropRet)
		enforce(false, false)
		add("stateless: not enforced", old.FromEndpoint, forwardACK, tcxNextRet)

		// A new connection: a SYN that finds no entry and creates one.
		// Each run is of a distinct connection (benchNewConnections
		// source ports of the endpoint's address), so each is single;
		// their entries are deleted in bulk between batches, outside
		// what the kernel times. The pass-through program runs the same
		// packets the same way for the ratio.
		enforce(true, true)
		var v bpfmaps.ConntrackValue
		// With uncached, the revision moves before each SYN (outside
		// the timed run), so that none takes the decision kept on its
		// CPU (`decision`) and each looks its peer and policy up.
		newConnection := func(name string, prog *ebpf.Program, uncached bool) {
			if skip(name) {
				// Its entry only, which the cases after it need.
				ctDelete()
				runPerPacket(b, prog, forwardSYN, 1, tcxNextRet)
				return
			}
			var single, newConn time.Duration
			for range benchNewConnections / benchSYNBatch {
				synDelete()
				for _, pkt := range synPackets {
					if uncached {
						revision.bump()
					}
					single += runPerPacket(b, passThrough, pkt, 1, tcxNextRet)
					newConn += runPerPacket(b, prog, pkt, 1, tcxNextRet)
				}
				// Each SYN opened its connection: none measured a drop
				// or a known connection's path.
				for i := range synPackets {
					synOpened(prog, i)
				}
			}
			synDelete()
			// The bench connection's own entry, which the cases after it
			// need.
			ctDelete()
			runPerPacket(b, prog, forwardSYN, 1, tcxNextRet)
			rows = append(rows, row{name,
				float64(newConn.Nanoseconds()) / benchNewConnections, float64(single.Nanoseconds()) / benchNewConnections})
		}
		if before != nil {
			newConnection("before: new connection (SYN, distinct connections)", before.fromEndpoint, false)
		}
		newConnection("tracking: new connection (SYN, distinct connections)", enf.fromEndpoint, false)

		// The connection becomes established as a real one does: a reply,
		// then its origin speaks again (the entry moves to conntrack).
		runPerPacket(b, enf.toEndpoint, replyACK, 1, tcxNextRet)
		runPerPacket(b, enf.fromEndpoint, forwardACK, 1, tcxNextRet)
		require.NoError(b, maps.Conntrack.Lookup(key, &v), "established")
		add("tracking: established, forward", enf.fromEndpoint, forwardACK, tcxNextRet)
		addBefore(add, "established, forward", from, forwardACK)
		// What an endpoint's own packet costs: its slot is looked up.
		require.NoError(b, enf.endpointAbsent.Set(&endpointFilter{}))
		add("tracking: established, forward, endpoints map looked up", enf.fromEndpoint, forwardACK, tcxNextRet)
		require.NoError(b, enf.endpointAbsent.Set(filter))
		require.NoError(b, maps.Conntrack.Lookup(key, &v))
		require.Equal(b, uint8(bpfmaps.ConntrackEstablished), v.Flags()&bpfmaps.ConntrackEstablished)
		add("tracking: established, reply", enf.toEndpoint, replyACK, tcxNextRet)
		addBefore(add, "established, reply", to, replyACK)
		ctDelete()
		add("tracking: untracked reply (dropped)", enf.toEndpoint, replyACK, tcxDropRet)
		addBefore(add, "untracked reply (dropped)", to, replyACK)
		// As when the map holds no identity-0 entry: the agent then
		// tells the program to skip that lookup (the trie is the same).
		require.NoError(b, enf.policyFlags.Set(uint32(policyNoAnyIdentity)))
		add("tracking: untracked reply (dropped), identity-0 lookup skipped", enf.toEndpoint, replyACK, tcxDropRet)
		require.NoError(b, enf.policyFlags.Set(uint32(0)))
		setEvents(events.Drops)
		add("events: untracked reply (dropped), drop events on", enf.toEndpoint, replyACK, tcxDropRet)
		setEvents(0)
		ctPut(bpfmaps.NewConntrackValue(bpfmaps.MonotonicNow()+time.Hour, uint8(policy.Egress), bpfmaps.ConntrackEstablished))
		setEvents(events.Drops | events.Verdicts)
		add("events: established, reply, verdict events on", enf.toEndpoint, replyACK, tcxNextRet)
		setEvents(0)
		ctDelete()
		// DNS the endpoint sends that verdict 3 allows: checked in full
		// every time (no established fast path), and with a proxy port the
		// proxy's socket is looked up.
		add("dns: UDP query, verdict 3, no proxy (port 0)", enf.fromEndpoint, dnsQuery, tcxNextRet)
		setDNSProxy(proxySocket.LocalAddr().(*net.UDPAddr).Port)
		add("dns: UDP query, verdict 3, proxy socket looked up", enf.fromEndpoint, dnsQuery, tcxNextRet)
		// Its answer, a reply from port 53 that bypassed the proxy: with
		// the proxy's port set it is recorded in dns-answers (runs that
		// the emptied ring has room for), or counted lost when the ring is
		// full.
		drainAnswers()
		base := runPerPacket(b, passThrough, forwardACK, benchAnswerRuns, tcxNextRet)
		d := runPerPacket(b, enf.toEndpoint, dnsAnswer, benchAnswerRuns, tcxNextRet)
		rows = append(rows, row{"dns: UDP answer, recorded (100 bytes)", float64(d.Nanoseconds()), float64(base.Nanoseconds())})
		add("dns: UDP answer, ring full (counted lost)", enf.toEndpoint, dnsAnswer, tcxNextRet)
		setDNSProxy(0)
		add("dns: UDP answer, no proxy (port 0): not recorded", enf.toEndpoint, dnsAnswer, tcxNextRet)

		enforce(false, false)
		add("tracking: not enforced, neither direction", enf.fromEndpoint, forwardACK, tcxNextRet)
		enforce(true, false)
		ctPut(bpfmaps.NewConntrackValue(bpfmaps.MonotonicNow()+time.Hour, uint8(policy.Egress), bpfmaps.ConntrackEstablished))
		add("tracking: not enforced, other direction enforced (established)", enf.fromEndpoint, forwardACK, tcxNextRet)
		addBefore(add, "not enforced, other direction enforced (established)", from, forwardACK)

		// With endpoints and DNS interception in place (issue 38): the
		// packet's own endpoint is in the map, bound to the device, with
		// a subject of its own (enforced both ways, its policy map the
		// rules above, the dns-proxy verdict among them), and the proxy's
		// port is set. Its lookup is done (its slot is not absent).
		enforce(true, true)
		setDNSProxy(proxySocket.LocalAddr().(*net.UDPAddr).Port)
		withEndpoint(true)
		key, subjectKey = subjectKey, key
		if before != nil {
			newConnection("before: endpoint+dns: new connection (SYN, distinct connections)", before.fromEndpoint, false)
		}
		newConnection("endpoint+dns: new connection (SYN, distinct connections)", enf.fromEndpoint, false)
		newConnection("endpoint+dns: new connection (SYN, distinct connections, revision moved before each)", enf.fromEndpoint, true)
		runPerPacket(b, enf.toEndpoint, replyACK, 1, tcxNextRet)
		runPerPacket(b, enf.fromEndpoint, forwardACK, 1, tcxNextRet)
		require.NoError(b, maps.Conntrack.Lookup(key, &v), "established, the subject's")
		add("endpoint+dns: established, forward", enf.fromEndpoint, forwardACK, tcxNextRet)
		// The same packet in single runs, as the SYNs are run: what a
		// single run costs whatever its path (the program and its maps
		// cold after the syscall), to weigh the SYN's own work against.
		if name := "endpoint+dns: established, forward (single runs)"; !skip(name) {
			var single, established time.Duration
			for range benchNewConnections {
				single += runPerPacket(b, passThrough, forwardACK, 1, tcxNextRet)
				established += runPerPacket(b, enf.fromEndpoint, forwardACK, 1, tcxNextRet)
			}
			rows = append(rows, row{name,
				float64(established.Nanoseconds()) / benchNewConnections, float64(single.Nanoseconds()) / benchNewConnections})
		}
		addBefore(add, "endpoint+dns: established, forward", from, forwardACK)
		add("endpoint+dns: established, reply", enf.toEndpoint, replyACK, tcxNextRet)
		addBefore(add, "endpoint+dns: established, reply", to, replyACK)
		// Two established connections whose packets alternate on one CPU:
		// each packet is of another connection than the one `flows`
		// keeps, so it pays the lookup and keeps its own. In single runs,
		// against the pass-through program's.
		other := netip.AddrPortFrom(benchEndpoint, benchEndpointPort+1)
		otherForward := tcpPacket(other, peer, ack)
		otherKey := bpfmaps.NewConntrackKey(progRunIfindex, other, peer, testProtoTCP)
		binary.NativeEndian.PutUint16(otherKey[38:40], uint16(benchSubject))
		alternating := func(name string, prog func(*enforcer) *ebpf.Program, e *enforcer, ct *ebpf.Map) {
			if skip(name) || e == nil {
				return
			}
			runPerPacket(b, prog(e), otherForward, 1, tcxNextRet)
			runPerPacket(b, e.toEndpoint, tcpPacket(peer, other, ack), 1, tcxNextRet)
			runPerPacket(b, prog(e), otherForward, 1, tcxNextRet)
			var o bpfmaps.ConntrackValue
			require.NoError(b, ct.Lookup(otherKey[:ct.KeySize()], &o), "the second connection established")
			var single, alternate time.Duration
			for range benchNewConnections / 2 {
				single += runPerPacket(b, passThrough, forwardACK, 1, tcxNextRet)
				single += runPerPacket(b, passThrough, otherForward, 1, tcxNextRet)
				alternate += runPerPacket(b, prog(e), forwardACK, 1, tcxNextRet)
				alternate += runPerPacket(b, prog(e), otherForward, 1, tcxNextRet)
			}
			rows = append(rows, row{name,
				float64(alternate.Nanoseconds()) / benchNewConnections, float64(single.Nanoseconds()) / benchNewConnections})
			require.NoError(b, ct.Delete(otherKey[:ct.KeySize()]))
		}
		alternating("endpoint+dns: established, forward, two connections alternating (single runs)", from, enf, maps.Conntrack)
		beforeConntrack := beforeCT
		if beforeConntrack == nil {
			beforeConntrack = maps.Conntrack // the same layout: shared
		}
		alternating("before: endpoint+dns: established, forward, two connections alternating (single runs)", from, before, beforeConntrack)
		ctDelete()
		key, subjectKey = subjectKey, key
		withEndpoint(false)
		setDNSProxy(0)
		rounds = append(rounds, rows)
	}
	// The forward target is a ratio to the stateless program's allowed
	// packet: that one, per round, from the two rows' own ratios.
	index := func(name string) int {
		return slices.IndexFunc(rounds[0], func(r row) bool { return r.name == name })
	}
	statelessAllowed := index("stateless: allowed")
	vsStateless := func(fwd int) float64 {
		r := make([]float64, 0, len(rounds))
		for _, rows := range rounds {
			r = append(r, (rows[fwd].ns/rows[fwd].base)/(rows[statelessAllowed].ns/rows[statelessAllowed].base))
		}
		slices.Sort(r)
		return r[len(r)/2]
	}
	var sb strings.Builder
	w := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Case\tns/packet\tx pass-through\n")
	for i := range rounds[0] {
		ratios := make([]float64, 0, len(rounds))
		for _, rows := range rounds {
			ratios = append(ratios, rows[i].ns/rows[i].base)
		}
		slices.Sort(ratios)
		median := ratios[len(ratios)/2]
		var ns float64
		for _, rows := range rounds {
			if rows[i].ns/rows[i].base == median {
				ns = rows[i].ns
			}
		}
		fmt.Fprintf(w, "%s\t%.0f\t%.2f\n", rounds[0][i].name, ns, median)
	}
	w.Flush()
	fmt.Printf("%d ipcache entries, BPF_PROG_RUN, median of %d rounds:\n%s", benchIPCacheEntries, len(rounds), sb.String())
	if only != "" {
		return
	}
	fmt.Printf("established forward / stateless allowed: %.2f\n", vsStateless(index("tracking: established, forward")))
	if before != nil {
		fmt.Printf("before: established forward / stateless allowed: %.2f\n", vsStateless(index("before: established, forward")))
	}
}

// hashPolicyMapSpec is the policy map's previous layout: a hash with an
// 8-byte key (sec_identity u32 | direction u8 | protocol u8 | dport be16;
// protocol 0 any protocol, dport 0 any port) and the same value.
func hashPolicyMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: bpfmaps.PolicyName, Type: ebpf.Hash, KeySize: hashPolicyKeySize, ValueSize: uint32(policyValueSize), MaxEntries: 16384}
}

// hashPolicyMapKey is a key of the previous layout.
func hashPolicyMapKey(identity uint32, direction, protocol uint8, dport uint16) [hashPolicyKeySize]byte {
	var k [hashPolicyKeySize]byte
	binary.LittleEndian.PutUint32(k[0:4], identity)
	k[4], k[5] = direction, protocol
	binary.BigEndian.PutUint16(k[6:8], dport)
	return k
}

// newHashPolicyMap is a map of the previous layout that allows rules
// (egress).
func newHashPolicyMap(tb testing.TB, rules []benchPolicyRule) *ebpf.Map {
	tb.Helper()
	m, err := ebpf.NewMap(hashPolicyMapSpec())
	require.NoError(tb, err)
	tb.Cleanup(func() { m.Close() })
	for _, r := range rules {
		require.NoError(tb, m.Put(hashPolicyMapKey(r.identity, uint8(policy.Egress), r.protocol, r.port), bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))))
	}
	return m
}

// passThroughProgram is the cheapest TCX program: it returns TCX_NEXT.
func passThroughProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		AttachType:   ebpf.AttachTCXIngress,
		License:      "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	require.NoError(tb, err)
	tb.Cleanup(func() { p.Close() })
	return p
}
