// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// putPolicy writes one policy map entry, as the policy writer would for
// a row of the `policy` table.
func putPolicy(t *testing.T, maps enforcerMaps, key policy.Key, verdict policy.Verdict) {
	t.Helper()
	require.NoError(t, maps.Policy.Put(bpfmaps.NewPolicyKey(key), bpfmaps.NewPolicyValue(uint32(verdict))))
	bumpRevision(t, maps)
}

func putEnforcement(t *testing.T, maps enforcerMaps, direction policy.Direction, value bpfmaps.EnforcementValue) {
	t.Helper()
	require.NoError(t, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(0, direction), uint32(value)))
	bumpRevision(t, maps)
}

// sendICMP sends one ICMP message of type typ (code 0, 20 bytes) from
// namespace ns to dst.
func sendICMP(t *testing.T, ns, dst string, typ uint8) {
	t.Helper()
	msg := make([]byte, 20)
	msg[0] = typ
	var sum uint32
	for i := 0; i < len(msg); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(msg[i:]))
	}
	sum = sum>>16 + sum&0xffff
	binary.BigEndian.PutUint16(msg[2:], ^uint16(sum+sum>>16))
	require.NoError(t, inNetns(t, ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: netip.MustParseAddr(dst).As4()})
	}))
}

// egressDrops returns the egress drops of reason so far.
func egressDrops(t *testing.T, maps enforcerMaps, reason bpfmaps.Reason) uint64 {
	t.Helper()
	for _, d := range readTestCounters(t, maps).Drops {
		if d.Direction == policy.Egress && d.Reason == reason {
			return d.Packets
		}
	}
	t.Fatalf("no egress count of %s", reason)
	return 0
}

// The endpoint connects to two peers (identities A and B) through the
// program, with policy map entries written as the agent writes them:
// deny against broader and narrower allows, across the remote identity and
// identity 0; a port range as aligned blocks; an ICMP type; a direction
// with deny rules only.
func TestPrivilegedDenyPortRangesICMPAndDenyOnly(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	const peerA, peerB = "10.200.0.2", "10.200.0.3"
	const idA, idB = testIdentityAllowed, testIdentityDenied
	nw := newEndpointNetwork(t, peerA, peerB)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, peerA+"/32", idA)
	putIdentity(t, maps, peerB+"/32", idB)
	const port = 5978
	for _, p := range []int{port, 7999, 8000, 8009, 8010} {
		netnstest.EchoTCP(t, nw.host, hostPort("0.0.0.0", p))
	}
	enf := loadTestEnforcer(t, maps)
	nw.attach(t, enf, newTestLinksDir(t))
	tcp := func(addr string, port int) bool {
		t.Helper()
		c, err := dialIn(t, nw.ep, "", hostPort(addr, port))
		return err == nil && exchange(c, "x") == nil
	}
	egress := func(id uint32, protocol policy.Protocol, port uint16, wildcard uint8) policy.Key {
		return policy.Key{Identity: identity.Number(id), Direction: policy.Egress, Protocol: protocol, Port: port, PortWildcardBits: wildcard}
	}
	reset := func(t *testing.T) {
		t.Cleanup(func() { putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceNone); clearPolicyMap(t, maps) })
	}

	t.Run("an identity's any-protocol deny beats an any-identity port allow", func(t *testing.T) {
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDefaultDeny)
		putPolicy(t, maps, egress(idA, 0, 0, 0), policy.VerdictDeny)
		putPolicy(t, maps, egress(0, policy.ProtocolTCP, port, 0), policy.VerdictAllow)
		denied := egressDrops(t, maps, bpfmaps.ReasonPolicyDeny)
		require.False(t, tcp(peerA, port), "A is denied whatever the port")
		require.Greater(t, egressDrops(t, maps, bpfmaps.ReasonPolicyDeny), denied, "counted as a deny")
		require.True(t, tcp(peerB, port), "B is allowed by the any-identity allow")
		require.False(t, tcp(peerB, 8000), "nothing allows B's other ports")
	})

	t.Run("an any-identity port deny beats an identity's any-protocol allow", func(t *testing.T) {
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDefaultDeny)
		putPolicy(t, maps, egress(0, policy.ProtocolTCP, port, 0), policy.VerdictDeny)
		putPolicy(t, maps, egress(idA, 0, 0, 0), policy.VerdictAllow)
		require.False(t, tcp(peerA, port))
		require.True(t, tcp(peerA, 8000), "the deny is of one port")
		require.True(t, nw.pingOnce(t, peerA), "and of one protocol")

		// policy_flags: while the agent says the map holds no identity-0
		// entry, the program does not look them up.
		require.NoError(t, enf.policyFlags.Set(uint32(policyNoAnyIdentity)))
		require.True(t, tcp(peerA, port), "identity 0 not looked up")
		require.NoError(t, enf.policyFlags.Set(uint32(0)))
		require.False(t, tcp(peerA, port))
	})

	t.Run("a port deny inside an identity's protocol-wide allow", func(t *testing.T) {
		// The agent writes no allow inside a deny's prefix of the same
		// identity; a deny inside an allow's is the LPM's longest match.
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDefaultDeny)
		putPolicy(t, maps, egress(idA, policy.ProtocolTCP, 0, 16), policy.VerdictAllow)
		putPolicy(t, maps, egress(idA, policy.ProtocolTCP, port, 0), policy.VerdictDeny)
		require.False(t, tcp(peerA, port))
		require.True(t, tcp(peerA, 8000))
	})

	t.Run("port range 8000-8009: blocks 8000/3 and 8008/1", func(t *testing.T) {
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDefaultDeny)
		putPolicy(t, maps, egress(idA, policy.ProtocolTCP, 8000, 3), policy.VerdictAllow)
		putPolicy(t, maps, egress(idA, policy.ProtocolTCP, 8008, 1), policy.VerdictAllow)
		require.True(t, tcp(peerA, 8000), "first")
		require.True(t, tcp(peerA, 8009), "last")
		require.False(t, tcp(peerA, 8010), "one past the last")
		require.False(t, tcp(peerA, 7999), "one before the first")
	})

	t.Run("ICMP type 8 allows echo requests, not other types", func(t *testing.T) {
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDefaultDeny)
		putPolicy(t, maps, egress(idA, policy.ProtocolICMP, 8<<8, 8), policy.VerdictAllow)
		require.True(t, nw.pingOnce(t, peerA), "echo request (type 8), its reply tracked")
		require.False(t, nw.pingOnce(t, peerB), "another identity")
		noPolicy := egressDrops(t, maps, bpfmaps.ReasonNoPolicy)
		sendICMP(t, nw.ep, peerA, 13) // timestamp request
		require.Eventually(t, func() bool { return egressDrops(t, maps, bpfmaps.ReasonNoPolicy) == noPolicy+1 },
			time.Second, 10*time.Millisecond, "type 13 dropped")
		require.False(t, tcp(peerA, port), "an ICMP rule allows no TCP")
	})

	t.Run("deny rules only: a deny drops, everything else passes", func(t *testing.T) {
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDenyOnly)
		putPolicy(t, maps, egress(idA, policy.ProtocolTCP, port, 0), policy.VerdictDeny)
		noPolicy := egressDrops(t, maps, bpfmaps.ReasonNoPolicy)
		require.False(t, tcp(peerA, port))
		require.True(t, tcp(peerA, 8000))
		require.True(t, tcp(peerB, port), "the deny is A's")
		require.True(t, nw.pingOnce(t, peerB))
		require.Equal(t, noPolicy, egressDrops(t, maps, bpfmaps.ReasonNoPolicy), "no default deny")
	})

	t.Run("drop all: what the policy allows drops too", func(t *testing.T) {
		reset(t)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDefaultDeny)
		putPolicy(t, maps, egress(idA, policy.ProtocolAny, 0, 0), policy.VerdictAllow)
		require.True(t, tcp(peerA, port), "allowed while default deny")
		denied := egressDrops(t, maps, bpfmaps.ReasonPolicyDeny)
		putEnforcement(t, maps, policy.Egress, bpfmaps.EnforceDropAll)
		require.False(t, tcp(peerA, port))
		require.False(t, nw.pingOnce(t, peerA))
		require.Greater(t, egressDrops(t, maps, bpfmaps.ReasonPolicyDeny), denied, "counted as policy-deny")
	})
}

// TestPrivilegedPolicyWriterTellsAnyIdentity: the policy writer tells the
// program that the map may hold identity-0 keys before it writes the
// first, and that it holds none once the last is deleted; a previous
// run's identity-0 key counts from the first call.
func TestPrivilegedPolicyWriterTellsAnyIdentity(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	m, err := ebpf.NewMap(bpfmaps.PolicySpec(16))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	pinned := bpfmaps.NewPolicyKey(policy.Key{Direction: policy.Egress})
	require.NoError(t, m.Put(pinned, bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))), "a previous run's")

	log := hivetest.Logger(t)
	p := newPolicyOps(func() mapwrite.Map { return m }, &mapwrite.Stats{}, newOrdering(log, nil, nil, nil, nil), log)
	var told []bool
	p.anyIdentity = func(present bool) error {
		// Told before the write: the map holds no key the program skips.
		found := false
		require.NoError(t, bpfmaps.ReadEntries(m, func(k bpfmaps.PolicyKey, _ bpfmaps.PolicyValue) {
			if id, _, _, _ := k.Fields(); id == 0 {
				found = true
			}
		}))
		if found {
			require.True(t, present, "told none while the map holds an identity-0 key")
		}
		told = append(told, present)
		return nil
	}
	entry := func(id uint32) *policy.Entry {
		return &policy.Entry{Key: policy.Key{Identity: identity.Number(id), Direction: policy.Egress,
			Protocol: policy.ProtocolTCP, Port: 80}, Verdict: policy.VerdictAllow}
	}
	ctx := context.Background()
	require.NoError(t, p.Update(ctx, nil, 0, entry(16777217)))
	require.Equal(t, []bool{true}, told, "the pinned identity-0 key")

	p.mu.Lock()
	require.NoError(t, p.ops.DeleteKeys([]bpfmaps.PolicyKey{pinned}))
	p.deletedLocked([]bpfmaps.PolicyKey{pinned})
	p.mu.Unlock()
	require.Equal(t, []bool{true, false}, told, "none left")

	require.NoError(t, p.Update(ctx, nil, 0, entry(16777218)))
	require.Equal(t, []bool{true, false}, told, "no change, nothing told")
	require.NoError(t, p.Update(ctx, nil, 0, entry(0)))
	require.Equal(t, []bool{true, false, true}, told, "before the identity-0 key is written")
	var v bpfmaps.PolicyValue
	require.NoError(t, m.Lookup(bpfmaps.NewPolicyKey(entry(0).Key), &v))
}

// TestEnforcementOf: a row's enforcement map value.
func TestEnforcementOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		enforced, hasDeny bool
		want              bpfmaps.EnforcementValue
	}{
		{false, false, bpfmaps.EnforceNone},
		{true, false, bpfmaps.EnforceDefaultDeny},
		{true, true, bpfmaps.EnforceDefaultDeny},
		{false, true, bpfmaps.EnforceDenyOnly},
	} {
		require.Equal(t, c.want, enforcementOf(&policy.Enforcement{Enforced: c.enforced, HasDeny: c.hasDeny}), "%+v", c)
	}
}
