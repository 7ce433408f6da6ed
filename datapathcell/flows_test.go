// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// onOneCPU runs the rest of the test's goroutine on CPU 0: what the
// program keeps per CPU (`decision`, `flows`) is then what every run sees.
func onOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	var was, one unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &was))
	one.Set(0)
	require.NoError(t, unix.SchedSetaffinity(0, &one))
	t.Cleanup(func() { require.NoError(t, unix.SchedSetaffinity(0, &was)) })
}

// keptFlowTest is a program over test maps with both directions of the
// default enforced (default deny): egress allows TCP to benchPeerPort and
// UDP to port 53 of benchPeer, ingress allows nothing, so a packet from
// the peer passes only as a reply.
type keptFlowTest struct {
	maps enforcerMaps
	d    *Datapath
	enf  *enforcer
}

func newKeptFlowTest(t *testing.T, timeouts bpfmaps.ConntrackTimeouts) *keptFlowTest {
	t.Helper()
	maps, _, d, enf := newRevisedTestTimeouts(t, timeouts)
	k := &keptFlowTest{maps: maps, d: d, enf: enf}
	w := d.written()
	require.NoError(t, w.ipcache.Put(bpfmaps.NewIPCacheKey(netip.PrefixFrom(benchPeer, 32)), bpfmaps.NewIPCacheValue(testIdentityAllowed)))
	require.NoError(t, w.policy.Put(k.allowKey(testProtoTCP, benchPeerPort), bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))))
	require.NoError(t, w.policy.Put(k.allowKey(testProtoUDP, 53), bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))))
	require.NoError(t, w.enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Egress), uint32(1)))
	require.NoError(t, w.enforcement.Put(bpfmaps.NewEnforcementKey(0, policy.Ingress), uint32(1)))
	return k
}

func (k *keptFlowTest) allowKey(protocol uint8, port uint16) bpfmaps.PolicyKey {
	return policyMapKey(testIdentityAllowed, uint8(policy.Egress), protocol, port)
}

// forward and reply run a packet the endpoint sends and one it receives.
func (k *keptFlowTest) forward(t *testing.T, pkt []byte, want uint32, msg string) {
	t.Helper()
	require.EqualValues(t, want, runVerdict(t, k.enf.fromEndpoint, pkt), msg)
}

func (k *keptFlowTest) reply(t *testing.T, pkt []byte, want uint32, msg string) {
	t.Helper()
	require.EqualValues(t, want, runVerdict(t, k.enf.toEndpoint, pkt), msg)
}

// establish runs a connection's packets until its entry is in `conntrack`
// and both directions have passed from there: what the program keeps.
func (k *keptFlowTest) establish(t *testing.T, forward, reply []byte, key bpfmaps.ConntrackKey) {
	t.Helper()
	k.forward(t, forward, tcxNextRet, "allowed")
	k.reply(t, reply, tcxNextRet, "the reply")
	k.forward(t, forward, tcxNextRet, "after a reply: moved to conntrack")
	var v bpfmaps.ConntrackValue
	require.NoError(t, k.maps.Conntrack.Lookup(key, &v), "established")
	k.forward(t, forward, tcxNextRet, "established")
	k.reply(t, reply, tcxNextRet, "established, the reply")
}

// deleteRaw deletes a connection's entry without telling the program.
func (k *keptFlowTest) deleteRaw(t *testing.T, key bpfmaps.ConntrackKey) {
	t.Helper()
	require.NoError(t, k.maps.Conntrack.Delete(key))
}

// The last connection that passed on a CPU is kept there (`flows`), so
// that its next packets skip the entry's lookup. Deleting the entry
// without telling the program shows what it keeps; each case below
// checks that a packet the lookup would decide otherwise does not pass
// that way.
func TestPrivilegedFlowKept(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	onOneCPU(t)
	out := netip.AddrPortFrom(benchEndpoint, benchEndpointPort)
	peer := netip.AddrPortFrom(benchPeer, benchPeerPort)
	forward, reply := tcpPacket(out, peer, 0x10), tcpPacket(peer, out, 0x10)
	key := bpfmaps.NewConntrackKey(progRunIfindex, out, peer, testProtoTCP)

	t.Run("until the program is told the entry went", func(t *testing.T) {
		k := newKeptFlowTest(t, bpfmaps.ConntrackTimeouts{})
		k.establish(t, forward, reply, key)
		k.deleteRaw(t, key)
		k.reply(t, reply, tcxNextRet, "kept: the deleted entry was not looked up")
		conntrackMaps{k.d}.ConntrackDeleted()
		k.reply(t, reply, tcxDropRet, "told: the reply is looked up and has no entry")
	})

	t.Run("until a write that could change a verdict", func(t *testing.T) {
		k := newKeptFlowTest(t, bpfmaps.ConntrackTimeouts{})
		k.establish(t, forward, reply, key)
		require.NoError(t, k.maps.Policy.Delete(k.allowKey(testProtoTCP, benchPeerPort)))
		k.forward(t, forward, tcxNextRet, "kept after a write that did not bump")
		require.NoError(t, k.d.written().policy.Delete(k.allowKey(testProtoUDP, 53)))
		k.forward(t, forward, tcxDropRet, "after a write: checked, the rule is gone")
	})

	t.Run("not a FIN or RST, which move the TCP state", func(t *testing.T) {
		k := newKeptFlowTest(t, bpfmaps.ConntrackTimeouts{})
		k.establish(t, forward, reply, key)
		for _, c := range []struct {
			pkt   []byte
			flag  uint8
			run   func(*testing.T, []byte, uint32, string)
			which string
		}{
			{tcpPacket(out, peer, 0x11), bpfmaps.ConntrackFINOrigin, k.forward, "the endpoint's FIN"},
			{tcpPacket(peer, out, 0x11), bpfmaps.ConntrackFINReply, k.reply, "the peer's FIN"},
			{tcpPacket(out, peer, 0x14), bpfmaps.ConntrackRST, k.forward, "the endpoint's RST"},
		} {
			c.run(t, c.pkt, tcxNextRet, c.which)
			var v bpfmaps.ConntrackValue
			require.NoError(t, k.maps.Conntrack.Lookup(key, &v))
			require.NotZero(t, v.Flags()&c.flag, "%s is in the entry", c.which)
		}
	})

	t.Run("not the reply of a connection revoked at the revision", func(t *testing.T) {
		k := newKeptFlowTest(t, bpfmaps.ConntrackTimeouts{})
		k.establish(t, forward, reply, key)
		require.NoError(t, k.d.written().policy.Delete(k.allowKey(testProtoTCP, benchPeerPort)))
		// The policy went, and the forward direction was not checked
		// since: the reply still passes, but is not kept.
		k.reply(t, reply, tcxNextRet, "a reply before the connection is checked again")
		k.forward(t, forward, tcxDropRet, "checked: no rule allows it, the entry is revoked")
		k.reply(t, reply, tcxDropRet, "a revoked connection's packet is no reply")
	})

	t.Run("not an entry that expires within the keep", func(t *testing.T) {
		short := bpfmaps.ConntrackTimeouts{TCPOpening: time.Minute, TCPEstablished: 500 * time.Millisecond,
			TCPClosing: 10 * time.Second, Other: time.Minute}
		k := newKeptFlowTest(t, short)
		k.establish(t, forward, reply, key)
		k.deleteRaw(t, key)
		k.reply(t, reply, tcxDropRet, "an entry the agent may collect as expired at any time is looked up")
	})

	t.Run("not DNS, whose answers may be recorded", func(t *testing.T) {
		k := newKeptFlowTest(t, bpfmaps.ConntrackTimeouts{})
		client := netip.AddrPortFrom(benchEndpoint, 41000)
		server := netip.AddrPortFrom(benchPeer, 53)
		query := frame4(client.Addr(), server.Addr(), testProtoUDP, udpHeader(client.Port(), server.Port(), make([]byte, 20)))
		answer := frame4(server.Addr(), client.Addr(), testProtoUDP, udpHeader(server.Port(), client.Port(), make([]byte, 40)))
		dnsKey := bpfmaps.NewConntrackKey(progRunIfindex, client, server, testProtoUDP)
		k.establish(t, query, answer, dnsKey)
		k.deleteRaw(t, dnsKey)
		k.reply(t, answer, tcxDropRet, "an answer from port 53 is looked up")
	})
}
