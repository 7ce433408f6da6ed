// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

const (
	ctPeer4, ctPeer6, ctOther4 = "10.200.0.2", "fd00:200::2", "10.200.0.3"
	ctEndpoint4                = "10.200.0.1"
	ctTCPPort, ctUDPPort       = 5978, 5353
	ctClosedUDPPort            = 5354
	ctEndpointPort             = 6379
)

// echoUDP serves UDP on addr in namespace ns: every datagram is sent back.
func echoUDP(t *testing.T, ns, addr string) {
	t.Helper()
	var c net.PacketConn
	require.NoError(t, inNetns(t, ns, func() (err error) { c, err = net.ListenPacket("udp", addr); return err }))
	var wg sync.WaitGroup
	t.Cleanup(func() { c.Close(); wg.Wait() })
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(buf[:n], from)
		}
	})
}

// dialIn dials TCP addr from namespace ns (from local, if set).
func dialIn(t *testing.T, ns, local, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := inNetns(t, ns, func() (err error) {
		d := net.Dialer{Timeout: time.Second}
		if local != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
		}
		c, err = d.Dial("tcp", addr)
		return err
	})
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// exchange writes msg on c and reports whether it comes back within a
// second.
func exchange(c net.Conn, msg string) error {
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo differs")
	}
	return nil
}

// udpExchange sends msg from the endpoint to addr on a connected socket
// and returns the error of reading the answer (nil: the echo came back).
func udpExchange(t *testing.T, ns, addr, msg string) error {
	t.Helper()
	var c net.Conn
	require.NoError(t, inNetns(t, ns, func() (err error) { c, err = net.Dial("udp", addr); return err }))
	defer c.Close()
	return exchange(c, msg)
}

func hostPort(addr string, port int) string {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port)).String()
}

// conntrackEntries reads the conntrack map.
func conntrackEntries(t *testing.T, maps enforcerMaps) map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue {
	t.Helper()
	out := conntrackMapEntries(t, maps.Conntrack)
	for k, v := range conntrackMapEntries(t, maps.ConntrackOpening) {
		out[k] = v
	}
	return out
}

// conntrackMapEntries reads one of the two conntrack maps.
func conntrackMapEntries(t *testing.T, m *ebpf.Map) map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue {
	t.Helper()
	out := map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue{}
	require.NoError(t, bpfmaps.ReadEntries(m, func(k bpfmaps.ConntrackKey, v bpfmaps.ConntrackValue) { out[k] = v }))
	return out
}

// lookupConntrack finds a connection's entry in conntrack or ct_opening.
func lookupConntrack(maps enforcerMaps, key bpfmaps.ConntrackKey, v *bpfmaps.ConntrackValue) error {
	err := maps.Conntrack.Lookup(key, v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return maps.ConntrackOpening.Lookup(key, v)
	}
	return err
}

// Both directions enforced: egress allows the peer, ingress allows only
// another identity. What the endpoint opens toward the peer gets its
// replies; what the peer opens toward the endpoint is dropped; removing
// the egress rule stops an established connection.
func TestPrivilegedConntrackRepliesOfAllowedConnections(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, ctPeer4, ctPeer6, ctOther4)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, ctPeer4+"/32", testIdentityAllowed)
	putIdentity(t, maps, ctPeer6+"/128", testIdentityAllowed)
	putIdentity(t, maps, ctOther4+"/32", testIdentityDenied)
	nw.attach(t, loadTestEnforcer(t, maps), newTestLinksDir(t))
	netnstest.EchoTCP(t, nw.host, hostPort(ctPeer4, ctTCPPort))
	netnstest.EchoTCP(t, nw.host, hostPort(ctPeer6, ctTCPPort))
	echoUDP(t, nw.host, hostPort(ctPeer4, ctUDPPort))
	echoUDP(t, nw.host, hostPort(ctPeer6, ctUDPPort))
	netnstest.EchoTCP(t, nw.ep, hostPort(ctEndpoint4, ctEndpointPort))

	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, 0, 0)
	// Ingress allows something else entirely.
	putAllow(t, maps, testIdentityDenied, policy.Ingress, testProtoTCP, 80)

	var conns []net.Conn
	parent := t // the connections outlive the first subtest
	t.Run("egress allows: TCP, UDP and ping get their replies", func(t *testing.T) {
		for _, peer := range []string{ctPeer4, ctPeer6} {
			c, err := dialIn(parent, nw.ep, "", hostPort(peer, ctTCPPort))
			require.NoError(t, err, "TCP to %s", peer)
			require.NoError(t, exchange(c, "hello"), "TCP data to %s", peer)
			conns = append(conns, c)
			require.NoError(t, udpExchange(t, nw.ep, hostPort(peer, ctUDPPort), "datagram"), "UDP to %s", peer)
			require.True(t, nw.pingOnce(t, peer), "ping %s", peer)
		}
		entries := conntrackEntries(t, maps)
		local := conns[0].LocalAddr().(*net.TCPAddr).AddrPort()
		key := bpfmaps.NewConntrackKey(uint32(nw.ifindex(t, nw.hostDevice)), netip.AddrPortFrom(local.Addr().Unmap(), local.Port()),
			netip.MustParseAddrPort(hostPort(ctPeer4, ctTCPPort)), testProtoTCP)
		v, ok := entries[key]
		require.True(t, ok, "no entry for the TCP connection in %v", entries)
		require.Equal(t, uint8(policy.Egress), v.Origin())
		require.Equal(t, uint8(bpfmaps.ConntrackEstablished|bpfmaps.ConntrackReplySeen), v.Flags())
		require.Greater(t, v.Expires(), bpfmaps.MonotonicNow()+5*time.Hour, "established: 6 h")
	})

	t.Run("an ICMP error about a tracked connection passes", func(t *testing.T) {
		// The peer answers a datagram to a closed port with ICMP port
		// unreachable, which ingress policy alone would drop.
		err := udpExchange(t, nw.ep, hostPort(ctPeer4, ctClosedUDPPort), "anyone?")
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
	})

	t.Run("the peer opening toward the endpoint is dropped", func(t *testing.T) {
		_, err := dialIn(t, nw.host, ctPeer4, hostPort(ctEndpoint4, ctEndpointPort))
		require.Error(t, err)
		require.False(t, nw.pingFromHost(t, ctPeer4))
		require.False(t, nw.pingFromHost(t, ctPeer6))
	})

	t.Run("removing the allowing rule stops the established connection", func(t *testing.T) {
		require.NotEmpty(t, conns)
		require.NoError(t, exchange(conns[0], "before"))
		require.NoError(t, maps.Policy.Delete(policyMapKey(testIdentityAllowed, uint8(policy.Egress), 0, 0)))
		bumpRevision(t, maps)
		require.Error(t, exchange(conns[0], "after"), "data passed without a rule")
		// The dropped forward packet revoked the entry: the replies stop
		// too, and the entry stays so that they cannot open one of their
		// own.
		local := conns[0].LocalAddr().(*net.TCPAddr).AddrPort()
		key := bpfmaps.NewConntrackKey(uint32(nw.ifindex(t, nw.hostDevice)), netip.AddrPortFrom(local.Addr().Unmap(), local.Port()),
			netip.MustParseAddrPort(hostPort(ctPeer4, ctTCPPort)), testProtoTCP)
		v, ok := conntrackEntries(t, maps)[key]
		require.True(t, ok, "entry of a connection policy now drops")
		require.NotZero(t, v.Flags()&bpfmaps.ConntrackRevoked, "entry of a connection policy now drops is not revoked")
	})
}

// A connection the peer opens, allowed by ingress policy, gets its replies
// through an egress that allows nothing.
func TestPrivilegedConntrackIngressConnectionReplies(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, ctPeer4)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, ctPeer4+"/32", testIdentityAllowed)
	nw.attach(t, loadTestEnforcer(t, maps), newTestLinksDir(t))
	netnstest.EchoTCP(t, nw.ep, hostPort(ctEndpoint4, ctEndpointPort))
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	putAllow(t, maps, testIdentityAllowed, policy.Ingress, testProtoTCP, ctEndpointPort)

	c, err := dialIn(t, nw.host, ctPeer4, hostPort(ctEndpoint4, ctEndpointPort))
	require.NoError(t, err)
	require.NoError(t, exchange(c, "hello"))
	// The endpoint cannot open anything itself.
	_, err = dialIn(t, nw.ep, "", hostPort(ctPeer4, 22))
	require.Error(t, err)
	require.False(t, nw.pingOnce(t, ctPeer4))
}

// A full ct_opening map (LRU) evicts: every allowed exchange still gets
// its reply, and the map holds no more than its size. (A UDP exchange of
// one datagram each way never becomes established: its origin does not
// speak after the reply.)
func TestPrivilegedConntrackFullMapEvicts(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, ctPeer4)
	maps := newTestEnforcerMaps(t)
	small, err := ebpf.NewMap(bpfmaps.ConntrackOpeningSpec(64))
	require.NoError(t, err)
	t.Cleanup(func() { small.Close() })
	maps.ConntrackOpening = small
	putIdentity(t, maps, ctPeer4+"/32", testIdentityAllowed)
	nw.attach(t, loadTestEnforcer(t, maps), newTestLinksDir(t))
	echoUDP(t, nw.host, hostPort(ctPeer4, ctUDPPort))
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoUDP, ctUDPPort)

	const flows = 300 // each from a port of its own
	for i := range flows {
		require.NoError(t, udpExchange(t, nw.ep, hostPort(ctPeer4, ctUDPPort), "x"), "exchange %d", i)
	}
	n := len(conntrackMapEntries(t, small))
	require.LessOrEqual(t, n, 64)
	require.Positive(t, n)
}

// Entries live as long as their timeout after their last packet (the
// conntrack cell's collector deletes them once expired: conntrackcell).
func TestPrivilegedConntrackExpiredEntriesAreCollected(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, ctPeer4)
	maps := newTestEnforcerMaps(t)
	const timeout = 2 * time.Second
	maps.ConntrackTimeouts = bpfmaps.ConntrackTimeouts{TCPOpening: timeout, TCPEstablished: timeout, TCPClosing: timeout, Other: timeout}
	putIdentity(t, maps, ctPeer4+"/32", testIdentityAllowed)
	nw.attach(t, loadTestEnforcer(t, maps), newTestLinksDir(t))
	echoUDP(t, nw.host, hostPort(ctPeer4, ctUDPPort))
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, 0, 0)

	start := bpfmaps.MonotonicNow()
	require.NoError(t, udpExchange(t, nw.ep, hostPort(ctPeer4, ctUDPPort), "x"))
	require.True(t, nw.pingOnce(t, ctPeer4))
	entries := conntrackEntries(t, maps)
	require.Len(t, entries, 2, "the UDP exchange and the ping")
	require.Len(t, conntrackMapEntries(t, maps.ConntrackOpening), 2, "neither is established: the origin did not speak after the reply")
	for _, v := range entries {
		require.LessOrEqual(t, v.Expires(), bpfmaps.MonotonicNow()+timeout, "the test timeout applies")
		// The program's clock may be a tick behind (now_ns in enforce.c);
		// a tick is at most 10 ms (HZ 100).
		require.GreaterOrEqual(t, v.Expires(), start+timeout-10*time.Millisecond)
	}
}

// The pinned conntrack map is reused as it is, migrated (entries kept)
// when only its size differs, and replaced by an empty map when its layout
// differs, like the other maps.
func TestPrivilegedConntrackMapPinReuseMigrateReplace(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	dir := filepath.Join(newTestLinksDir(t), "..")
	require.NoError(t, os.MkdirAll(dir, 0o700)) // bpfmaps.Open makes it before
	log := hivetest.Logger(t)
	open := func(maxEntries uint32) *ebpf.Map {
		t.Helper()
		maps, err := bpfmaps.Open(dir, bpfmaps.Sizes{IPCache: 16, Policy: 16, Conntrack: maxEntries, ConntrackOpening: 256},
			[]string{"lo"}, log)
		require.NoError(t, err)
		t.Cleanup(func() { maps.Close() })
		return maps.Conntrack
	}
	key := bpfmaps.NewConntrackKey(progRunIfindex, netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("192.0.2.1:443"), testProtoTCP)
	value := bpfmaps.NewConntrackValue(bpfmaps.MonotonicNow()+time.Hour, uint8(policy.Egress), bpfmaps.ConntrackEstablished)

	first := open(1024)
	require.NoError(t, first.Put(key, value))
	id := func(m *ebpf.Map) ebpf.MapID {
		info, err := m.Info()
		require.NoError(t, err)
		id, _ := info.ID()
		return id
	}
	again := open(1024)
	require.Equal(t, id(first), id(again), "reused")

	migrated := open(2048)
	require.NotEqual(t, id(first), id(migrated))
	require.EqualValues(t, 2048, migrated.MaxEntries())
	require.Equal(t, map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue{key: value}, conntrackMapEntries(t, migrated), "entries kept")

	// A map of the previous layout (say, a smaller value) is replaced.
	pin := filepath.Join(dir, bpfmaps.ConntrackName)
	require.NoError(t, os.Remove(pin))
	spec := bpfmaps.ConntrackSpec(2048)
	spec.ValueSize = 8
	old, err := ebpf.NewMap(spec)
	require.NoError(t, err)
	defer old.Close()
	require.NoError(t, old.Pin(pin))
	replaced := open(2048)
	require.Equal(t, uint32(len(bpfmaps.ConntrackValue{})), replaced.ValueSize())
	require.Empty(t, conntrackMapEntries(t, replaced))

	// A map of the layout before the device was in the key (an LRU hash
	// with 40-byte keys) is converted: each entry once per device of
	// --devices (here the loopback, ifindex 1).
	require.NoError(t, os.Remove(pin))
	previous, err := ebpf.NewMap(previousConntrackMapSpec(2048))
	require.NoError(t, err)
	defer previous.Close()
	require.NoError(t, previous.Put(key[:previousConntrackKeySize], value))
	require.NoError(t, previous.Pin(pin))
	converted := open(2048)
	require.Equal(t, ebpf.Hash, converted.Type())
	require.Equal(t, map[bpfmaps.ConntrackKey]bpfmaps.ConntrackValue{key: value}, conntrackMapEntries(t, converted), "entries kept, on the device")
}

// The program reads the coarse clock once per jiffy and CPU and keeps it in
// its per-CPU map clock: an entry created in the jiffy in which the clock
// was kept takes its expiry from the kept value. The test plants a false
// time in every CPU's slot, keeping the jiffy, and looks for a new
// connection's expiry computed from it; a tick between the two runs makes
// the program read the clock again, so it tries a few times. Not
// parallel: each try must run both packets in one jiffy on one CPU, which
// the package's other tests, taking the CPUs, make rarer.
func TestPrivilegedConntrackClockReadOncePerJiffy(t *testing.T) {
	privileged.Test(t)
	maps := newTestEnforcerMaps(t)
	putIdentity(t, maps, ctPeer4+"/32", testIdentityAllowed)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoTCP, 80)
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	enf := loadTestEnforcer(t, maps)
	clock := enforcerClockMap(t, enf)

	type slot struct{ Jiffies, Ns uint64 }
	const planted = uint64(1e12) // 1000 s after boot: long before now
	peer := netip.MustParseAddrPort(hostPort(ctPeer4, 80))
	syn := func(port uint16) (bpfmaps.ConntrackKey, []byte) {
		ep := netip.AddrPortFrom(netip.MustParseAddr(ctEndpoint4), port)
		return bpfmaps.NewConntrackKey(progRunIfindex, ep, peer, testProtoTCP), tcpPacket(ep, peer, 0x02)
	}
	opening := uint64(time.Minute) // the TCP opening timeout the program is loaded with
	for attempt := range 200 {
		start := bpfmaps.MonotonicNow()
		// Fill the slot of the CPU this runs on.
		_, first := syn(20000)
		runPerPacket(t, enf.fromEndpoint, first, 1, tcxNextRet)
		var slots []slot
		require.NoError(t, clock.Lookup(uint32(0), &slots))
		kept := false
		for i := range slots {
			if slots[i].Jiffies != 0 {
				if slots[i].Ns == planted {
					continue // an earlier attempt's, on a CPU not used since
				}
				require.GreaterOrEqual(t, slots[i].Ns, uint64(start)-uint64(time.Second), "a kept value is the coarse clock")
				require.LessOrEqual(t, slots[i].Ns, uint64(bpfmaps.MonotonicNow()))
				slots[i].Ns = planted
				kept = true
			}
		}
		require.True(t, kept, "no CPU kept the clock")
		require.NoError(t, clock.Put(uint32(0), slots))

		key, pkt := syn(uint16(30000 + attempt))
		runPerPacket(t, enf.fromEndpoint, pkt, 1, tcxNextRet)
		var v bpfmaps.ConntrackValue
		require.NoError(t, lookupConntrack(maps, key, &v))
		if uint64(v.Expires()) == planted+opening {
			return
		}
		// The clock was read again: a tick passed, or the run moved to a
		// CPU whose slot is older.
		require.GreaterOrEqual(t, v.Expires(), start+time.Duration(opening)-time.Second)
	}
	t.Fatal("no expiry came from the kept clock value")
}

// enforcerClockMap is the program's own clock map (not one of the agent's
// pinned maps: the loader creates it).
func enforcerClockMap(t *testing.T, enf *enforcer) *ebpf.Map {
	t.Helper()
	info, err := enf.fromEndpoint.Info()
	require.NoError(t, err)
	ids, ok := info.MapIDs()
	require.True(t, ok)
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		require.NoError(t, err)
		mi, err := m.Info()
		require.NoError(t, err)
		if mi.Name == "clock" {
			t.Cleanup(func() { m.Close() })
			return m
		}
		m.Close()
	}
	t.Fatal("the program has no clock map")
	return nil
}
