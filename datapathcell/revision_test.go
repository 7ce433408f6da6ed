// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// newRevisedTest loads the program over test maps and returns them, their
// revision counter, a Datapath whose writers (Datapath.written) write
// those maps and bump the counter, and the program.
func newRevisedTest(t *testing.T) (enforcerMaps, *revisionCounter, *Datapath, *enforcer) {
	t.Helper()
	return newRevisedTestTimeouts(t, bpfmaps.ConntrackTimeouts{})
}

// newRevisedTestTimeouts is newRevisedTest with the program's conntrack
// timeouts set (zero: its defaults).
func newRevisedTestTimeouts(t *testing.T, timeouts bpfmaps.ConntrackTimeouts) (enforcerMaps, *revisionCounter, *Datapath, *enforcer) {
	t.Helper()
	maps := newTestEnforcerMaps(t)
	maps.ConntrackTimeouts = timeouts
	counter, err := newRevisionCounter(maps.Revision)
	require.NoError(t, err)
	t.Cleanup(func() { counter.Close() })
	d := &Datapath{
		maps:     &bpfmaps.Pinned{IPCache: maps.IPCache, Policy: maps.Policy, Enforcement: maps.Enforcement},
		revision: counter,
	}
	return maps, counter, d, loadTestEnforcer(t, maps)
}

// A forward packet of an established connection skips the policy lookups
// while nothing that could change its verdict was written; each write the
// writers make through the datapath's maps (Datapath.written, the maps
// every writer gets) makes the next forward packet look policy up again.
// Raw writes, which do not bump the revision, show that the verdict is
// indeed kept: without the bumps, each case below would let the packet
// pass.
func TestPrivilegedVerdictKeptUntilAWrite(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps, counter, d, enf := newRevisedTest(t)

	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	forward := tcpPacket(out, peer, 0x10)
	ctKey := bpfmaps.NewConntrackKey(progRunIfindex, out, peer, testProtoTCP)
	peerKey := bpfmaps.NewIPCacheKey(netip.PrefixFrom(benchPeer, 32))
	allowKey := policyMapKey(testIdentityAllowed, uint8(policy.Egress), testProtoTCP, benchPeerPort)
	allow := bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))
	run := func(want uint32, msg string) {
		t.Helper()
		ret, err := enf.fromEndpoint.Run(&ebpf.RunOptions{Data: forward})
		require.NoError(t, err)
		require.Equal(t, want, ret, msg)
	}
	// establish writes the state that allows the connection through the
	// writers' maps and sends a forward packet, which stores its verdict.
	establish := func() {
		t.Helper()
		w := d.written()
		require.NoError(t, w.ipcache.Put(peerKey, bpfmaps.NewIPCacheValue(testIdentityAllowed)))
		require.NoError(t, w.policy.Put(allowKey, allow))
		require.NoError(t, w.enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Egress), uint32(1)))
		run(tcxNextRet, "allowed")
		var v bpfmaps.ConntrackValue
		require.NoError(t, lookupConntrack(maps, ctKey, &v))
		require.Equal(t, counter.load()&revisionMask, v.Checked(), "verdict stored at the current revision")
	}
	dropped := func(what string) {
		t.Helper()
		run(tcxDropRet, "after "+what)
		var v bpfmaps.ConntrackValue
		require.NoError(t, lookupConntrack(maps, ctKey, &v), "entry kept after "+what)
		require.NotZero(t, v.Flags()&bpfmaps.ConntrackRevoked, "entry revoked after "+what)
		require.Zero(t, v.Checked(), "no verdict kept after "+what)
	}

	establish()
	// A raw write is not seen while the revision stays: the kept verdict
	// is used.
	require.NoError(t, maps.Policy.Delete(allowKey))
	run(tcxNextRet, "kept verdict after a write that did not bump")
	require.NoError(t, maps.Policy.Put(allowKey, allow))
	require.NoError(t, d.written().policy.Delete(allowKey))
	dropped("policy entry deleted")

	establish()
	require.NoError(t, d.written().ipcache.Put(peerKey, bpfmaps.NewIPCacheValue(testIdentityDenied)))
	dropped("remote's identity changed")

	establish()
	_, err := d.written().ipcache.BatchUpdate([]bpfmaps.IPCacheKey{peerKey}, []bpfmaps.IPCacheValue{bpfmaps.NewIPCacheValue(testIdentityDenied)}, nil)
	require.NoError(t, err)
	dropped("remote's identity changed in a batch")

	establish()
	_, err = d.written().ipcache.BatchDelete([]bpfmaps.IPCacheKey{peerKey}, nil)
	require.NoError(t, err)
	dropped("remote's entry deleted in a batch (world)")

	establish()
	_, err = d.written().policy.BatchDelete([]bpfmaps.PolicyKey{allowKey}, nil)
	require.NoError(t, err)
	dropped("policy entry deleted in a batch")

	// Enforcement: egress off and on again around a raw policy delete.
	establish()
	require.NoError(t, d.written().enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Egress), uint32(0)))
	require.NoError(t, maps.Policy.Delete(allowKey))
	require.NoError(t, d.written().enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Egress), uint32(1)))
	dropped("enforcement switched")
}

// A direction that is not enforced tracks without a verdict: its entry
// is never trusted once the direction is enforced.
func TestPrivilegedEntryOfUnenforcedDirectionHasNoVerdict(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	putEnforced(t, maps, policy.Ingress, true)
	// An ACK passes but opens nothing there (see the next test); a SYN
	// opens the connection.
	ret, err := enf.fromEndpoint.Run(&ebpf.RunOptions{Data: tcpPacket(out, peer, 0x02)})
	require.NoError(t, err)
	require.EqualValues(t, tcxNextRet, ret)
	var v bpfmaps.ConntrackValue
	require.NoError(t, lookupConntrack(maps, bpfmaps.NewConntrackKey(progRunIfindex, out, peer, testProtoTCP), &v))
	require.Zero(t, v.Checked())
}

// In a direction that is not enforced only a packet that opens a
// connection creates an entry: a TCP SYN without ACK, an echo request, a
// UDP datagram. A peer's ACK there cannot make the connection its own
// (origin ingress), which would let the endpoint's packets pass egress as
// its replies.
func TestPrivilegedOnlyOpeningPacketsCreateEntriesUnenforced(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	// Egress enforced, default deny, nothing allowed; ingress not enforced.
	putEnforced(t, maps, policy.Egress, true)
	key := bpfmaps.NewConntrackKey(progRunIfindex, out, peer, testProtoTCP)
	for _, flags := range []uint8{0x10, 0x12, 0x18, 0x11, 0x04} { // ACK, SYN-ACK, PSH-ACK, FIN-ACK, RST
		ret, err := enf.toEndpoint.Run(&ebpf.RunOptions{Data: tcpPacket(peer, out, flags)})
		require.NoError(t, err)
		require.EqualValues(t, tcxNextRet, ret, "ingress is not enforced")
		var v bpfmaps.ConntrackValue
		require.ErrorIs(t, lookupConntrack(maps, key, &v), ebpf.ErrKeyNotExist, "TCP flags %#x created an entry", flags)
		ret, err = enf.fromEndpoint.Run(&ebpf.RunOptions{Data: tcpPacket(out, peer, 0x10)})
		require.NoError(t, err)
		require.EqualValues(t, tcxDropRet, ret, "the endpoint's ACK passed egress after the peer's flags %#x", flags)
	}
	// The peer's SYN does open a connection, whose replies then pass.
	ret, err := enf.toEndpoint.Run(&ebpf.RunOptions{Data: tcpPacket(peer, out, 0x02)})
	require.NoError(t, err)
	require.EqualValues(t, tcxNextRet, ret)
	ret, err = enf.fromEndpoint.Run(&ebpf.RunOptions{Data: tcpPacket(out, peer, 0x12)})
	require.NoError(t, err)
	require.EqualValues(t, tcxNextRet, ret, "the SYN-ACK of a connection the peer opened")
}

func TestPrivilegedRevisionCounter(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	newMap := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	ct := newMap(bpfmaps.ConntrackSpec(16))
	rev := newMap(bpfmaps.RevisionSpec())
	counter, err := newRevisionCounter(rev)
	require.NoError(t, err)
	t.Cleanup(func() { counter.Close() })

	t.Run("a new counter starts above every stored revision", func(t *testing.T) {
		for i, checked := range []uint64{7, 1 << 40, 3} {
			v := bpfmaps.NewConntrackValue(1, 1, bpfmaps.ConntrackEstablished)
			v[10], v[11] = byte(checked), byte(checked>>8)
			v[12], v[13], v[14], v[15] = byte(checked>>16), byte(checked>>24), byte(checked>>32), byte(checked>>40)
			require.Equal(t, checked, v.Checked())
			require.NoError(t, ct.Put(bpfmaps.NewConntrackKey(progRunIfindex, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:1"), uint8(i)), v))
		}
		require.NoError(t, counter.startAbove(ct))
		require.Equal(t, uint64(1<<40+1), counter.load())
	})
	t.Run("a kept counter keeps counting", func(t *testing.T) {
		require.NoError(t, counter.startAbove(ct))
		require.Equal(t, uint64(1<<40+2), counter.load())
		var v uint64
		require.NoError(t, rev.Lookup(uint32(0), &v), "the map holds what the counter says")
		require.Equal(t, counter.load(), v)
	})
	t.Run("the low 48 bits never read 0", func(t *testing.T) {
		require.NoError(t, rev.Put(uint32(0), uint64(revisionMask)))
		counter.bump()
		require.Equal(t, uint64(revisionMask+2), counter.load())
	})
	t.Run("a closed counter does not bump", func(t *testing.T) {
		c, err := newRevisionCounter(rev)
		require.NoError(t, err)
		require.NoError(t, c.Close())
		c.bump()
		require.NoError(t, c.Close())
	})
}

// A new connection's remote identity and verdict are kept per CPU for the
// next one to the same peer and port (`decision`) only while the revision
// stays: raw writes, which do not bump it, show the kept decision is
// taken; the writers' writes, which do, are seen by the next SYN.
func TestPrivilegedDecisionKeptUntilAWrite(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	maps, _, d, enf := newRevisedTest(t)
	onOneCPU(t)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	peerKey := bpfmaps.NewIPCacheKey(netip.PrefixFrom(benchPeer, 32))
	allowKey := policyMapKey(testIdentityAllowed, uint8(policy.Egress), testProtoTCP, benchPeerPort)
	allow := bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))
	port := uint16(20000)
	// syn opens a connection from a port not used before.
	syn := func(want uint32, msg string) {
		t.Helper()
		port++
		require.EqualValues(t, want, runVerdict(t, enf.fromEndpoint, tcpPacket(netip.AddrPortFrom(benchEndpoint, port), peer, 0x02)), msg)
	}
	w := d.written()
	require.NoError(t, w.ipcache.Put(peerKey, bpfmaps.NewIPCacheValue(testIdentityAllowed)))
	require.NoError(t, w.policy.Put(allowKey, allow))
	require.NoError(t, w.enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Egress), uint32(1)))
	syn(tcxNextRet, "allowed")

	require.NoError(t, maps.Policy.Delete(allowKey))
	syn(tcxNextRet, "kept decision after a write that did not bump")
	require.NoError(t, maps.Policy.Put(allowKey, allow))
	require.NoError(t, d.written().policy.Delete(allowKey))
	syn(tcxDropRet, "policy entry deleted")
	require.NoError(t, d.written().policy.Put(allowKey, allow))
	syn(tcxNextRet, "policy entry back")

	require.NoError(t, maps.IPCache.Put(peerKey, bpfmaps.NewIPCacheValue(testIdentityDenied)))
	syn(tcxNextRet, "kept identity after a write that did not bump")
	require.NoError(t, d.written().ipcache.Put(peerKey, bpfmaps.NewIPCacheValue(testIdentityDenied)))
	syn(tcxDropRet, "peer's identity changed")

	// Another port of the same peer is not the kept decision's.
	require.NoError(t, d.written().ipcache.Put(peerKey, bpfmaps.NewIPCacheValue(testIdentityAllowed)))
	syn(tcxNextRet, "allowed again")
	other := netip.AddrPortFrom(benchPeer, benchPeerPort+1)
	require.EqualValues(t, tcxDropRet, runVerdict(t, enf.fromEndpoint, tcpPacket(netip.AddrPortFrom(benchEndpoint, 30000), other, 0x02)), "another port")
}
