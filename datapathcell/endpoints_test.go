// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// testEndpointIdentity is the label identity of the endpoint of an
// endpointNetwork in these tests.
const testEndpointIdentity = 300

// spoofedDrops is the count of egress drops for a spoofed source.
func spoofedDrops(t *testing.T, maps enforcerMaps) uint64 {
	t.Helper()
	for _, d := range readTestCounters(t, maps).Drops {
		if d.Direction == policy.Egress && d.Reason == bpfmaps.ReasonSpoofedSource {
			return d.Packets
		}
	}
	return 0
}

// TestPrivilegedSpoofedSourceDropped: a second workload, behind another
// device (host1) in a namespace of its own, sends real traffic with the
// address of the endpoint behind host0. While nothing binds that address
// to a device, the program lets it pass (nothing is enforced); once the
// endpoints map binds it to host0 (written through bpfmaps, as the agent
// does), every such packet from host1 is dropped with reason
// spoofed-source, whatever is enforced, and its event names the endpoint
// whose address it carried. The endpoint itself still speaks on host0.
func TestPrivilegedSpoofedSourceDropped(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, "10.200.0.2")
	spoofer := fmt.Sprintf("ipca-sp-%d-%d", os.Getpid(), netnsSeq.Add(1))
	ipCmd(t, "netns", "add", spoofer)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", spoofer).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", spoofer, err, out)
		}
	})
	ipCmd(t, "-n", nw.host, "link", "add", "host1", "type", "veth", "peer", "name", "sp0", "netns", spoofer)
	ipCmd(t, "-n", nw.host, "addr", "add", "10.201.0.2/24", "dev", "host1")
	ipCmd(t, "-n", nw.host, "link", "set", "host1", "up")
	ipCmd(t, "-n", spoofer, "addr", "add", "10.201.0.1/24", "dev", "sp0")
	ipCmd(t, "-n", spoofer, "addr", "add", "10.200.0.1/32", "dev", "sp0") // the endpoint's
	ipCmd(t, "-n", spoofer, "link", "set", "sp0", "up")
	ipCmd(t, "-n", spoofer, "link", "set", "lo", "up")
	spoof := func() {
		// Unanswered (the host routes the reply to host0): what counts is
		// what the program did with the three requests.
		exec.Command("ip", "netns", "exec", spoofer,
			"ping", "-n", "-q", "-c", "3", "-i", "0.05", "-W", "1", "-I", "10.200.0.1", "10.201.0.2").Run()
	}

	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	linksDir := newTestLinksDir(t)
	nw.attach(t, enf, linksDir)
	require.NoError(t, inNetns(t, nw.host, func() error { return enf.attach("host1", linksDir) }))

	spoof()
	require.Zero(t, spoofedDrops(t, maps), "no endpoint bound to the address: nothing is spoofed")

	r, err := ringbuf.NewReader(enf.events)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	require.NoError(t, enf.eventsMask.Set(uint32(events.Drops)))
	k := bpfmaps.NewEndpointKey(netip.MustParseAddr("10.200.0.1"))
	v := bpfmaps.NewEndpointValue(testEndpointIdentity, uint32(nw.ifindex(t, nw.hostDevice)))
	require.NoError(t, maps.Endpoints.Put(&k, &v))
	bumpRevision(t, maps)

	spoof()
	require.Equal(t, uint64(3), spoofedDrops(t, maps), "each request from host1 with the endpoint's address")
	r.SetDeadline(time.Now().Add(5 * time.Second))
	rec, err := r.Read()
	require.NoError(t, err, "no drop event")
	e, err := events.Decode(rec.RawSample, uint64(bpfmaps.MonotonicNow()), time.Now())
	require.NoError(t, err)
	require.False(t, e.Allowed)
	require.Equal(t, bpfmaps.ReasonSpoofedSource, e.Reason)
	require.Equal(t, "spoofed-source", e.Reason.String())
	require.Equal(t, identity.Number(testEndpointIdentity), e.Endpoint)
	require.Equal(t, uint32(nw.ifindex(t, "host1")), e.Ifindex)
	require.Equal(t, policy.Egress, e.Direction)
	require.Equal(t, netip.MustParseAddr("10.200.0.1"), e.Src)
	require.Equal(t, netip.MustParseAddr("10.201.0.2"), e.Dst)

	require.Equal(t, 3, nw.ping(t, "10.200.0.2", 3, "0.05"), "the endpoint itself, on its device")
	require.Equal(t, uint64(3), spoofedDrops(t, maps))
}

// TestPrivilegedEndpointPolicy: traffic of a local endpoint is enforced as
// its subject's entries say, not as the default's: its identity's
// enforcement entries drop its echo requests while its policy map is
// missing (a subject without a map has no entries), its own map's allow
// lets them pass (the replies as replies of its connection), and the
// default's entries are not consulted (the default enforces nothing, and
// an allow there does not help the endpoint).
func TestPrivilegedEndpointPolicy(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, "10.200.0.2")
	maps := newTestEnforcerMaps(t)
	enf := loadTestEnforcer(t, maps)
	nw.attach(t, enf, newTestLinksDir(t))

	k := bpfmaps.NewEndpointKey(netip.MustParseAddr("10.200.0.1"))
	v := bpfmaps.NewEndpointValue(testEndpointIdentity, 0)
	require.NoError(t, maps.Endpoints.Put(&k, &v))
	for _, dir := range policy.Directions() {
		require.NoError(t, maps.Enforcement.Put(bpfmaps.NewEnforcementKey(testEndpointIdentity, dir), uint32(bpfmaps.EnforceDefaultDeny)))
	}
	allowEcho := bpfmaps.NewPolicyKey(policy.Key{Identity: identity.World, Direction: policy.Egress})
	allow := bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))
	require.NoError(t, maps.Policy.Put(&allowEcho, &allow)) // the default's
	bumpRevision(t, maps)
	require.Zero(t, nw.ping(t, "10.200.0.2", 3, "0.05"), "the endpoint's subject enforces, with no entries")

	m, err := bpfmaps.AddPolicyOf(maps.Policies, testEndpointIdentity, 64)
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Put(&allowEcho, &allow))
	bumpRevision(t, maps)
	require.Equal(t, 3, nw.ping(t, "10.200.0.2", 3, "0.05"), "allowed by the endpoint's own map")
	got, err := bpfmaps.PolicyOf(maps.Policies, testEndpointIdentity)
	require.NoError(t, err)
	got.Close()

	// Without the endpoint's entry its traffic is the default's again,
	// which enforces nothing.
	require.NoError(t, maps.Endpoints.Delete(&k))
	require.NoError(t, m.Delete(&allowEcho))
	bumpRevision(t, maps)
	require.Equal(t, 3, nw.ping(t, "10.200.0.2", 3, "0.05"), "the host-wide default's: not enforced")
}
