// SPDX-License-Identifier: Apache-2.0

package restorecell_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Restore's start hook runs after the Checkpointer's, and its job after
// the Datapath's start hook, by dependency, not by the order of the cells:
// with the restore cell listed first, a restart still restores the pinned
// prefix with its number.
func TestPrivilegedRestoreWhateverTheOrderOfTheCells(t *testing.T) {
	privileged.Test(t)
	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	stateDir := t.TempDir()
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	prefix := netip.MustParsePrefix("10.0.0.1/32")

	var checkpointer *identitycell.Checkpointer
	start := func(order ...cell.Cell) (*hive.Hive, *ipcachecell.IPCache, *restorecell.Restorer) {
		var (
			c *ipcachecell.IPCache
			r *restorecell.Restorer
		)
		h := cells.NewHive(append(order, cell.Invoke(func(ipc *ipcachecell.IPCache, rr *restorecell.Restorer, cp *identitycell.Checkpointer) {
			c, r, checkpointer = ipc, rr, cp
		}))...)
		hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = stateDir })
		hive.AddConfigOverride(h, func(c *datapathcell.Config) { c.BPFRoot = bpfRoot })
		hive.AddConfigOverride(h, func(c *restorecell.Config) { c.IdentityRestoreGracePeriod = time.Hour })
		// Bounded: were restore's hook to run before those it waits for,
		// the start would fail at this timeout rather than hang.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, h.Start(hivetest.Logger(t), ctx))
		return h, c, r
	}

	first, c, _ := start(identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell, restorecell.Cell)
	owner, err := c.NewHandle("owner", source.Local)
	require.NoError(t, err)
	require.NoError(t, owner.Upsert(prefix, ipcachecell.Metadata{}))
	var before map[netip.Prefix]identity.Number
	require.Eventually(t, func() bool {
		before, err = bpfmaps.ReadIPCache(bpfRoot)
		return err == nil && len(before) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, first.Stop(hivetest.Logger(t), context.Background()))

	second, _, r := start(restorecell.Cell, datapathcell.Cell, policycell.Cell, ipcachecell.Cell, identitycell.Cell)
	defer second.Stop(hivetest.Logger(t), context.Background())
	select {
	case <-r.Restored():
	case <-time.After(30 * time.Second):
		t.Fatal("not restored 30 s after the start")
	}
	require.Equal(t, 1, r.Status().Restored)
	after, err := bpfmaps.ReadIPCache(bpfRoot)
	require.NoError(t, err)
	require.Equal(t, before, after, "same number")
	saved, err := checkpointer.Previous(context.Background())
	require.NoError(t, err)
	require.Zero(t, saved.Len(), "restored, the previous checkpoint is not kept")
}

// The grace period ends before an owner has re-asserted its prefixes (its
// source is read late): nothing is released until it has, so no prefix it
// still wants leaves the map or changes number; what it no longer wants is
// released then.
func TestPrivilegedReleaseWaitsForLateOwners(t *testing.T) {
	privileged.Test(t)
	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	stateDir := t.TempDir()
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	prefixes := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32"), netip.MustParsePrefix("10.0.0.3/32"),
	}
	batch := func(ps []netip.Prefix) []ipcachecell.PrefixUpsert {
		var out []ipcachecell.PrefixUpsert
		for _, p := range ps {
			out = append(out, ipcachecell.PrefixUpsert{Prefix: p})
		}
		return out
	}

	type agent struct {
		hive      *hive.Hive
		ipcache   *ipcachecell.IPCache
		restorer  *restorecell.Restorer
		ownerDone func()
	}
	start := func(grace time.Duration) *agent {
		a := &agent{}
		a.hive = cells.NewHive(identitycell.Cell, ipcachecell.Cell, policycell.Cell, datapathcell.Cell, restorecell.Cell,
			cell.Invoke(func(c *ipcachecell.IPCache, r *restorecell.Restorer) {
				a.ipcache, a.restorer = c, r
				a.ownerDone = c.RegisterProducer("late-owner")
			}))
		hive.AddConfigOverride(a.hive, func(c *statedir.Config) { c.StateDir = stateDir })
		hive.AddConfigOverride(a.hive, func(c *datapathcell.Config) { c.BPFRoot = bpfRoot })
		hive.AddConfigOverride(a.hive, func(c *restorecell.Config) { c.IdentityRestoreGracePeriod = grace })
		require.NoError(t, a.hive.Start(hivetest.Logger(t), context.Background()))
		return a
	}
	pinned := func() map[netip.Prefix]identity.Number {
		m, err := bpfmaps.ReadIPCache(bpfRoot)
		require.NoError(t, err)
		return m
	}

	first := start(time.Hour)
	owner, err := first.ipcache.NewHandle("owner", source.Local)
	require.NoError(t, err)
	require.NoError(t, owner.UpsertBatch(batch(prefixes)))
	first.ownerDone()
	require.Eventually(t, func() bool { return len(pinned()) == 3 }, 10*time.Second, 10*time.Millisecond)
	before := pinned()
	require.NoError(t, first.hive.Stop(hivetest.Logger(t), context.Background()))

	second := start(100 * time.Millisecond)
	defer second.hive.Stop(hivetest.Logger(t), context.Background())
	// Well past the grace period, the owner has still not spoken.
	time.Sleep(time.Second)
	require.False(t, second.restorer.Status().Released, "released before the owner re-asserted")
	require.Equal(t, before, pinned())

	// The owner comes, wanting two of its three prefixes.
	owner, err = second.ipcache.NewHandle("owner", source.Local)
	require.NoError(t, err)
	require.NoError(t, owner.UpsertBatch(batch(prefixes[:2])))
	second.ownerDone()
	require.Eventually(t, func() bool { return second.restorer.Status().Released }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(pinned()) == 2 }, 10*time.Second, 10*time.Millisecond)
	after := pinned()
	for _, p := range prefixes[:2] {
		require.Equal(t, before[p], after[p], "%s kept its number", p)
	}
}
