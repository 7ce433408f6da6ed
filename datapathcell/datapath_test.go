// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"maps"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// env is a private bpffs mount and state directory that successive agents
// (hives) share, as successive runs of the agent share /sys/fs/bpf.
type env struct {
	bpfRoot, stateDir string
}

func newEnv(t *testing.T) *env {
	privileged.Test(t)
	e := &env{bpfRoot: filepath.Join(t.TempDir(), "bpf"), stateDir: t.TempDir()}
	t.Cleanup(func() { unix.Unmount(e.bpfRoot, unix.MNT_DETACH) })
	return e
}

func (e *env) pinPath(name string) string { return filepath.Join(e.bpfRoot, "ipcache-agent", name) }

// agent is one run of the agent's cells.
type agent struct {
	hive     *hive.Hive
	ipcache  *ipcachecell.IPCache
	datapath *datapathcell.Datapath
	pinned   bpfmaps.PinnedIPCache
	stop     func()
}

// start runs identity, ipcache and datapath cells over the env. If
// producer is not empty, it is registered as an ipcache producer and its
// done function returned.
func (e *env) start(t *testing.T, producer string, flags ...string) (*agent, func()) {
	t.Helper()
	return e.startWith(t, cell.Group(), producer, flags...)
}

// startWith is start with extra cells in the hive.
func (e *env) startWith(t *testing.T, extra cell.Cell, producer string, flags ...string) (*agent, func()) {
	t.Helper()
	a := &agent{}
	var done func()
	a.hive = cells.NewHive(identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell, extra,
		cell.Invoke(func(c *ipcachecell.IPCache, d *datapathcell.Datapath, pinned bpfmaps.PinnedIPCache) {
			a.ipcache, a.datapath, a.pinned = c, d, pinned
			if producer != "" {
				done = c.RegisterProducer(producer)
			}
		}))
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	a.hive.RegisterFlags(fs)
	require.NoError(t, fs.Parse(append([]string{"--bpf-root=" + e.bpfRoot, "--state-dir=" + e.stateDir}, flags...)))
	log := hivetest.Logger(t)
	require.NoError(t, a.hive.Start(log, context.Background()))
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			require.NoError(t, a.hive.Stop(log, context.Background()))
		}
	}
	t.Cleanup(stop)
	if done == nil {
		done = func() {}
	}
	a.stop = stop
	return a, done
}

// dumpIPCache reads the pinned ipcache map: prefix -> identity.
func (e *env) dumpIPCache(t *testing.T) map[netip.Prefix]uint32 {
	t.Helper()
	m, err := bpfmaps.ReadIPCache(e.bpfRoot)
	require.NoError(t, err)
	out := make(map[netip.Prefix]uint32, len(m))
	for p, id := range m {
		out[p] = uint32(id)
	}
	return out
}

func (e *env) waitIPCache(t *testing.T, want map[netip.Prefix]uint32) {
	t.Helper()
	require.Eventually(t, func() bool { return maps.Equal(e.dumpIPCache(t), want) }, 10*time.Second, 10*time.Millisecond,
		"ipcache map %v, want %v", e.dumpIPCache(t), want)
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func upsert(t *testing.T, h *ipcachecell.Handle, ps []netip.Prefix, md ipcachecell.Metadata) {
	t.Helper()
	batch := make([]ipcachecell.PrefixUpsert, len(ps))
	for i, p := range ps {
		batch[i] = ipcachecell.PrefixUpsert{Prefix: p, Metadata: md}
	}
	require.NoError(t, h.UpsertBatch(batch))
}

// upsertHosts upserts n /32 prefixes a.b.x.y with an explicit identity and
// returns them and the map content they should give.
func upsertHosts(t *testing.T, h *ipcachecell.Handle, a, b byte, n int, ident uint32) ([]netip.Prefix, map[netip.Prefix]uint32) {
	t.Helper()
	var ps []netip.Prefix
	want := map[netip.Prefix]uint32{}
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{a, b, byte(i >> 8), byte(i)}), 32)
		ps = append(ps, p)
		want[p] = ident
	}
	upsert(t, h, ps, ipcachecell.Metadata{ExplicitIdentity: identity.Number(ident)})
	return ps, want
}

func TestPrivilegedRowsAndDeletionsReachTheMap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, _ := e.start(t, "")
	h, err := a.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)

	upsert(t, h, prefixes("10.0.0.0/8"), ipcachecell.Metadata{RequestedIdentity: 16777300})
	upsert(t, h, prefixes("2001:db8::/32"), ipcachecell.Metadata{ExplicitIdentity: 5000})
	e.waitIPCache(t, map[netip.Prefix]uint32{
		netip.MustParsePrefix("10.0.0.0/8"):    16777300,
		netip.MustParsePrefix("2001:db8::/32"): 5000,
	})

	require.NoError(t, h.Remove(netip.MustParsePrefix("10.0.0.0/8")))
	e.waitIPCache(t, map[netip.Prefix]uint32{netip.MustParsePrefix("2001:db8::/32"): 5000})
}

// TestPrivilegedPruneOnlyAfterInitialization: entries of the pinned map that
// nobody wants survive until every producer is done, then go.
func TestPrivilegedPruneOnlyAfterInitialization(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "")
	h, err := first.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsert(t, h, prefixes("10.0.0.1/32", "10.0.0.2/32"), ipcachecell.Metadata{ExplicitIdentity: 7000})
	old := map[netip.Prefix]uint32{netip.MustParsePrefix("10.0.0.1/32"): 7000, netip.MustParsePrefix("10.0.0.2/32"): 7000}
	e.waitIPCache(t, old)
	first.stop()

	second, done := e.start(t, "slow-producer")
	require.Equal(t, old, pinnedSnapshot(t, second), "snapshot of the pinned map at start")
	h, err = second.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsert(t, h, prefixes("10.0.0.2/32", "10.0.0.3/32"), ipcachecell.Metadata{ExplicitIdentity: 7000})
	want := map[netip.Prefix]uint32{
		netip.MustParsePrefix("10.0.0.1/32"): 7000, // stale, but not yet prunable
		netip.MustParsePrefix("10.0.0.2/32"): 7000,
		netip.MustParsePrefix("10.0.0.3/32"): 7000,
	}
	e.waitIPCache(t, want)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, want, e.dumpIPCache(t), "nothing pruned before initialization")

	done()
	delete(want, netip.MustParsePrefix("10.0.0.1/32"))
	e.waitIPCache(t, want)
}

func TestPrivilegedIncompatibleMapIsReplaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A first run creates the pin directory on the bpffs mount.
	first, _ := e.start(t, "")
	first.stop()
	require.NoError(t, unix.Unlink(e.pinPath("ipcache")))
	wrong, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 4})
	require.NoError(t, err)
	require.NoError(t, wrong.Put(uint64(1), uint64(2)))
	require.NoError(t, wrong.Pin(e.pinPath("ipcache")))
	wrong.Close()

	a, _ := e.start(t, "")
	require.Empty(t, pinnedSnapshot(t, a), "nothing restored from an incompatible map")
	m, err := ebpf.LoadPinnedMap(e.pinPath("ipcache"), nil)
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, ebpf.LPMTrie, m.Type())
	require.Equal(t, uint32(24), m.KeySize())
	h, err := a.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsert(t, h, prefixes("10.0.0.0/8"), ipcachecell.Metadata{ExplicitIdentity: 9})
	e.waitIPCache(t, map[netip.Prefix]uint32{netip.MustParsePrefix("10.0.0.0/8"): 9})
}

func TestPrivilegedMaxEntriesChangeKeepsEveryEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "", "--ipcache-map-max-entries=1000")
	h, err := first.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	_, want := upsertHosts(t, h, 10, 0, 300, 8000)
	e.waitIPCache(t, want)
	first.stop()

	second, _ := e.start(t, "never-done", "--ipcache-map-max-entries=2000")
	require.Equal(t, want, pinnedSnapshot(t, second))
	require.Equal(t, want, e.dumpIPCache(t), "every entry migrated")
	m, err := ebpf.LoadPinnedMap(e.pinPath("ipcache"), nil)
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, uint32(2000), m.MaxEntries())
	_, err = ebpf.LoadPinnedMap(e.pinPath("ipcache_new"), nil)
	require.Error(t, err, "no temporary pin left")
}

// TestPrivilegedRestartWritesOnlyChanges: after a restart, entries the
// pinned map already holds with the same value are not written again.
func TestPrivilegedRestartWritesOnlyChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "")
	h, err := first.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	ps, want := upsertHosts(t, h, 10, 1, 300, 8000)
	e.waitIPCache(t, want)
	// The writes are counted once the batch that made them returns, a
	// moment after the map shows them.
	require.Eventually(t, func() bool {
		written, unchanged := first.datapath.MapWrites(bpfmaps.IPCacheName)
		return written == 300 && unchanged == 0
	}, 5*time.Second, 10*time.Millisecond)
	first.stop()

	// The owner is a registered producer, as every real one is: nothing is
	// pruned before it has re-asserted what it wants.
	second, done := e.start(t, "test")
	h, err = second.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsert(t, h, ps[1:], ipcachecell.Metadata{ExplicitIdentity: 8000})                  // 299 unchanged
	upsert(t, h, ps[:1], ipcachecell.Metadata{ExplicitIdentity: 8001})                  // 1 changed
	upsert(t, h, prefixes("10.2.0.0/16"), ipcachecell.Metadata{ExplicitIdentity: 8002}) // 1 new
	want[ps[0]] = 8001
	want[netip.MustParsePrefix("10.2.0.0/16")] = 8002
	done()
	e.waitIPCache(t, want)
	require.Eventually(t, func() bool {
		written, unchanged := second.datapath.MapWrites(bpfmaps.IPCacheName)
		return written == 2 && unchanged == 299
	}, 5*time.Second, 10*time.Millisecond)
}

// rawIPCacheKey builds an ipcache map key field by field, canonical or not.
func rawIPCacheKey(prefixLen uint32, clusterID uint16, family byte, ip ...byte) bpfmaps.IPCacheKey {
	var k bpfmaps.IPCacheKey
	k[0], k[1], k[2], k[3] = byte(prefixLen), byte(prefixLen>>8), byte(prefixLen>>16), byte(prefixLen>>24)
	k[4], k[5] = byte(clusterID), byte(clusterID>>8)
	k[7] = family
	copy(k[8:], ip)
	return k
}

// TestPrivilegedUnreadablePinnedKeysGoAtTheFirstPrune: keys of the pinned
// map that are no prefix (unknown family, nonzero cluster_id, a length
// that makes a family-0 key match every IPv4 lookup) are not restored and
// go at the first prune; a key with host bits set is its masked prefix's
// entry: kept, not renumbered, not rewritten.
func TestPrivilegedUnreadablePinnedKeysGoAtTheFirstPrune(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "")
	first.stop()

	m, err := ebpf.LoadPinnedMap(e.pinPath(bpfmaps.IPCacheName), nil)
	require.NoError(t, err)
	defer m.Close()
	bad := []bpfmaps.IPCacheKey{
		rawIPCacheKey(32+8, 0, 7, 10),           // unknown family
		rawIPCacheKey(64, 1, 1, 10, 0, 9, 9),    // nonzero cluster_id
		rawIPCacheKey(31, 0, 0),                 // family 0, matches every IPv4 lookup
		rawIPCacheKey(32+33, 0, 1, 10, 0, 8, 8), // length out of range for IPv4
	}
	value := bpfmaps.NewIPCacheValue(7001)
	for _, k := range bad {
		require.NoError(t, m.Put(&k, &value), "put %x", k)
	}
	hostBits := rawIPCacheKey(32+24, 0, 1, 10, 0, 5, 7)
	kept := bpfmaps.NewIPCacheValue(7000)
	require.NoError(t, m.Put(&hostBits, &kept))

	second, done := e.start(t, "slow-producer")
	require.Equal(t, map[netip.Prefix]uint32{netip.MustParsePrefix("10.0.5.0/24"): 7000}, pinnedSnapshot(t, second),
		"only the readable entry is restored, as its masked prefix")
	h, err := second.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	upsert(t, h, prefixes("10.0.5.0/24"), ipcachecell.Metadata{ExplicitIdentity: 7000})
	require.Eventually(t, func() bool {
		_, unchanged := second.datapath.MapWrites(bpfmaps.IPCacheName)
		return unchanged == 1
	}, 10*time.Second, 10*time.Millisecond, "the host-bits entry is the wanted one: not written again")
	require.Equal(t, 1+len(bad), countPinned(t, m), "nothing pruned before initialization")

	done()
	require.Eventually(t, func() bool { return countPinned(t, m) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the unreadable keys go at the first prune")
	require.Equal(t, uint64(1), second.datapath.Prunes(bpfmaps.IPCacheName), "at the first prune, not a later one")
	require.Equal(t, map[netip.Prefix]uint32{netip.MustParsePrefix("10.0.5.0/24"): 7000}, e.dumpIPCache(t))
}

func countPinned(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var k bpfmaps.IPCacheKey
	var v bpfmaps.IPCacheValue
	n := 0
	iter := m.Iterate()
	for iter.Next(&k, &v) {
		n++
	}
	require.NoError(t, iter.Err())
	return n
}

// A counters map pinned by an agent of an older layout (4 entries of
// u64 packets) is replaced by one of 16 entries of packets and bytes,
// which Counters reads.
func TestPrivilegedOldCountersLayoutIsReplaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "")
	first.stop()
	require.NoError(t, unix.Unlink(e.pinPath(bpfmaps.CountersName)))
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 4})
	require.NoError(t, err)
	require.NoError(t, old.Pin(e.pinPath(bpfmaps.CountersName)))
	old.Close()

	a, _ := e.start(t, "")
	m, err := ebpf.LoadPinnedMap(e.pinPath(bpfmaps.CountersName), nil)
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, ebpf.PerCPUArray, m.Type())
	require.Equal(t, uint32(16), m.ValueSize())
	require.Equal(t, uint32(16), m.MaxEntries())
	c, err := a.datapath.Counters()
	require.NoError(t, err)
	require.Len(t, c.Drops, 2*len(bpfmaps.DropReasons()))
}

// A counters map of the previous layout (8 entries: direction*4 + slot)
// keeps its counts, each in its direction's slot of the current layout
// (direction*8 + slot), not copied index for index.
func TestPrivilegedPreviousCountersLayoutIsMigrated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first, _ := e.start(t, "")
	first.stop()
	require.NoError(t, unix.Unlink(e.pinPath(bpfmaps.CountersName)))
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 8})
	require.NoError(t, err)
	type counter struct{ Packets, Bytes uint64 }
	cpus, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	for index := range uint32(8) {
		values := make([]counter, cpus)
		values[0] = counter{Packets: uint64(index + 1), Bytes: uint64(100 * (index + 1))}
		require.NoError(t, old.Put(index, values))
	}
	require.NoError(t, old.Pin(e.pinPath(bpfmaps.CountersName)))
	old.Close()

	a, _ := e.start(t, "")
	c, err := a.datapath.Counters()
	require.NoError(t, err)
	// Old index 0 ingress allowed, 1-3 ingress drops; 4 egress allowed,
	// 5-7 egress drops.
	require.Equal(t, uint64(1), c.IngressAllowed)
	require.Equal(t, uint64(5), c.EgressAllowed)
	require.Equal(t, uint64(2+3+4), c.IngressDropped)
	require.Equal(t, uint64(6+7+8), c.EgressDropped)
	require.Equal(t, uint64(800), c.EgressDroppedBytes-uint64(100*(6+7)))
	for _, d := range c.Drops {
		if d.Reason == bpfmaps.ReasonPolicyDeny {
			want := map[policy.Direction]uint64{policy.Ingress: 4, policy.Egress: 8}[d.Direction]
			require.Equal(t, want, d.Packets, "policy-deny drops of %v", d.Direction)
		}
	}
}
