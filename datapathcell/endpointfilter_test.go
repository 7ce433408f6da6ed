// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestPrivilegedEndpointSlotsAsTheProgram: the program finds the local
// endpoint of a packet whose address's slot, as endpointSlot computes it,
// is the only one endpoint_absent leaves looked up, for IPv4 and IPv6
// addresses alike (a slot computed otherwise would be skipped, and the
// packet would be the default's, which enforces nothing); and it skips
// the lookup, the packet then being the default's, once the slot is said
// to be absent. A device key's slot is looked up and skipped alike.
func TestPrivilegedEndpointSlotsAsTheProgram(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps, enf := loadEgressDenyEnforcer(t)
	peer4, peer6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 64 {
		var addr netip.Addr
		var frame []byte
		if i%2 == 0 {
			addr = netip.AddrFrom4([4]byte{10, byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
			frame = frame4(addr, peer4, testProtoTCP, tcpHeader(40000, 80, 0x02))
		} else {
			var a [16]byte
			for j := range a {
				a[j] = byte(rng.Uint32())
			}
			a[0] = 0xfd
			addr = netip.AddrFrom16(a)
			frame = frame6(addr, peer6, nil, testProtoTCP, tcpHeader(40000, 80, 0x02))
		}
		k := bpfmaps.NewEndpointKey(addr)
		v := bpfmaps.NewEndpointValue(testEndpointIdentity, 0)
		require.NoError(t, maps.Endpoints.Put(&k, &v))

		require.NoError(t, enf.endpointAbsent.Set(&endpointFilter{}))
		require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, frame), "%s: every slot looked up", addr)
		require.NoError(t, enf.endpointAbsent.Set(absentExcept(slices.Values([]bpfmaps.EndpointKey{k}))))
		require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, frame), "%s: only its slot (%d) looked up", addr, endpointSlot(k))
		other := endpointSlot(k) ^ 1
		f := absentExcept()
		f[other/64] &^= 1 << (other % 64)
		require.NoError(t, enf.endpointAbsent.Set(f))
		require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, frame), "%s: its slot skipped", addr)

		require.NoError(t, maps.Endpoints.Delete(&k))
	}

	// A device key: what the device sends from an address of no endpoint
	// is spoofed where its slot is looked up.
	k := bpfmaps.NewEndpointDeviceKey(progRunIfindex)
	v := bpfmaps.NewEndpointValue(0, progRunIfindex)
	require.NoError(t, maps.Endpoints.Put(&k, &v))
	frame := frame4(netip.MustParseAddr("10.0.0.9"), peer4, testProtoTCP, tcpHeader(40000, 80, 0x02))
	require.NoError(t, enf.endpointAbsent.Set(absentExcept(slices.Values([]bpfmaps.EndpointKey{k}))))
	require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, frame), "the device's slot (%d) looked up", endpointSlot(k))
	require.NoError(t, enf.endpointAbsent.Set(absentExcept()))
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, frame), "the device's slot skipped")
}

// loadEgressDenyEnforcer loads an enforcer on new maps in which the
// endpoint's subject (testEndpointIdentity) drops what it sends and the
// default passes it, so that a verdict tells which of the two a packet
// was taken for.
func loadEgressDenyEnforcer(t *testing.T) (enforcerMaps, *enforcer) {
	t.Helper()
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	require.NoError(t, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(testEndpointIdentity, policy.Egress), uint32(bpfmaps.EnforceDefaultDeny)))
	bumpRevision(t, maps)
	return maps, enf
}

// TestEndpointSlotOfBenchmark: the benchmark's packets, not an endpoint's,
// fall in a slot of none of the benchmark's endpoints, so that they
// measure the skipped lookup (and its case with every slot looked up,
// the lookup).
func TestEndpointSlotOfBenchmark(t *testing.T) {
	t.Parallel()
	own := endpointSlot(bpfmaps.NewEndpointKey(benchEndpoint))
	for i := range benchEndpoints {
		addr := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		require.NotEqual(t, own, endpointSlot(bpfmaps.NewEndpointKey(addr)), addr)
	}
}

// TestPrivilegedEndpointWordsAsTheProgram: the program takes an IPv4
// packet's endpoint from its slot's word (endpoint_words) when the word
// is its address's, as endpointWord encodes it, with no entry in the map
// (which a real word never lacks: here it tells the two apart): the
// word's identity is the subject, and its device binds the address. A
// word of another address in the slot is not the packet's.
func TestPrivilegedEndpointWordsAsTheProgram(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps, enf := loadEgressDenyEnforcer(t)
	addr, peer := netip.MustParseAddr("10.7.0.1"), netip.MustParseAddr("192.0.2.1")
	k := bpfmaps.NewEndpointKey(addr)
	frame := frame4(addr, peer, testProtoTCP, tcpHeader(40000, 80, 0x02))
	slot := endpointSlot(k)
	// Every slot absent: only a word finds the endpoint.
	require.NoError(t, enf.endpointAbsent.Set(absentExcept()))
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, frame), "no word: the default's")

	word, ok := endpointWord(k, bpfmaps.NewEndpointValue(testEndpointIdentity, 0))
	require.True(t, ok)
	require.NoError(t, enf.setEndpointWords(endpointWords{slot: word}))
	require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, frame), "its word: its subject's")

	// Bound to the device the packet is on, and to another one.
	word, _ = endpointWord(k, bpfmaps.NewEndpointValue(testEndpointIdentity, progRunIfindex))
	require.NoError(t, enf.setEndpointWords(endpointWords{slot: word}))
	require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, frame), "bound here: its subject's")
	require.NoError(t, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(testEndpointIdentity, policy.Egress), uint32(bpfmaps.EnforceNone)))
	bumpRevision(t, maps)
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, frame), "bound here, its subject not enforced")
	word, _ = endpointWord(k, bpfmaps.NewEndpointValue(testEndpointIdentity, progRunIfindex+100))
	require.NoError(t, enf.setEndpointWords(endpointWords{slot: word}))
	require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, frame), "bound to another device: spoofed")

	// Another address's word in the same slot.
	var other netip.Addr
	for i := 0; ; i++ {
		other = netip.AddrFrom4([4]byte{10, 8, byte(i >> 8), byte(i)})
		if endpointSlot(bpfmaps.NewEndpointKey(other)) == slot {
			break
		}
	}
	word, _ = endpointWord(bpfmaps.NewEndpointKey(other), bpfmaps.NewEndpointValue(testEndpointIdentity, progRunIfindex+100))
	require.NoError(t, enf.setEndpointWords(endpointWords{slot: word}))
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, frame), "%s's word: not the packet's", other)
	require.NoError(t, enf.setEndpointWords(endpointWords{}))
	require.EqualValues(t, tcxNextRet, runVerdict(t, enf.fromEndpoint, frame), "the word gone")
}

// TestPrivilegedEndpointWordsMapped: the words are mapped only whole and
// 8-byte aligned (each is written with one atomic store), a word the
// agent stores is the one the program's .bss holds, and a closed
// enforcer's words are not written.
func TestPrivilegedEndpointWordsMapped(t *testing.T) {
	privileged.Test(t)
	spec, err := bpf.LoadEnforce()
	require.NoError(t, err)
	offset, err := variableOffset(spec, ".bss", bpf.EnforceVarEndpointWords)
	require.NoError(t, err)
	// As the loader creates it: mmapable, which its variables need.
	bssSpec := spec.Maps[".bss"].Copy()
	bssSpec.Flags |= unix.BPF_F_MMAPABLE
	bss, err := ebpf.NewMap(bssSpec)
	require.NoError(t, err)
	t.Cleanup(func() { bss.Close() })
	for _, off := range []uint32{offset + 4, bss.ValueSize() - 8} {
		_, err := mapWords(bss, off)
		require.ErrorIs(t, err, errWordsNotMapped, "offset %d", off)
	}

	words, err := mapWords(bss, offset)
	require.NoError(t, err)
	words.store(endpointSlots-1, 0x0102030405060708)
	mem, err := bss.Memory()
	require.NoError(t, err)
	var buf [8]byte
	_, err = mem.ReadAt(buf[:], int64(offset)+8*(endpointSlots-1))
	require.NoError(t, err)
	require.Equal(t, uint64(0x0102030405060708), binary.NativeEndian.Uint64(buf[:]), "the last word, in the map")
	require.NoError(t, words.close())

	enf, err := loadEnforcer(newTestEnforcerMaps(t))
	require.NoError(t, err)
	require.NoError(t, enf.Close())
	require.ErrorIs(t, enf.setEndpointWords(endpointWords{1: 1}), errWordsNotMapped)
}

// TestEndpointWordsOf: a word for each slot of one IPv4 address whose
// identity and device fit in 16 bits (identity not 0); none for a slot of
// two addresses, counting the other keys given (an address the map may
// hold meanwhile), nor for IPv6 addresses and devices.
func TestEndpointWordsOf(t *testing.T) {
	t.Parallel()
	a, b := netip.MustParseAddr("10.7.0.1"), netip.MustParseAddr("10.7.0.2")
	ka, kb := bpfmaps.NewEndpointKey(a), bpfmaps.NewEndpointKey(b)
	require.NotEqual(t, endpointSlot(ka), endpointSlot(kb))
	var same netip.Addr
	for i := 0; ; i++ {
		same = netip.AddrFrom4([4]byte{10, 8, byte(i >> 8), byte(i)})
		if endpointSlot(bpfmaps.NewEndpointKey(same)) == endpointSlot(ka) {
			break
		}
	}
	v := bpfmaps.NewEndpointValue(testEndpointIdentity, 7)
	entries := map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{
		ka: v, kb: v,
		bpfmaps.NewEndpointKey(netip.MustParseAddr("fd00::1")): v,
		bpfmaps.NewEndpointDeviceKey(7):                        bpfmaps.NewEndpointValue(0, 7),
	}
	words := endpointWordsOf(entries)
	require.Len(t, words, 2)
	require.Equal(t, uint64(0x0100070a)|uint64(testEndpointIdentity)<<32|uint64(7)<<48, words[endpointSlot(ka)], "10.7.0.1's word")

	words = endpointWordsOf(entries, slices.Values([]bpfmaps.EndpointKey{bpfmaps.NewEndpointKey(same)}))
	require.Len(t, words, 1, "a slot of two addresses has no word")
	require.Contains(t, words, endpointSlot(kb))

	for _, v := range []bpfmaps.EndpointValue{bpfmaps.NewEndpointValue(0, 7), bpfmaps.NewEndpointValue(65536, 7), bpfmaps.NewEndpointValue(testEndpointIdentity, 65536)} {
		require.Empty(t, endpointWordsOf(map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{ka: v}), "does not fit: %v", v)
	}
}
