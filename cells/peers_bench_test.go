// SPDX-License-Identifier: Apache-2.0

package cells_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/policygen"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The shape of BenchmarkPeerLabelChangeToKernel, as policycell's
// BenchmarkPeerRelabel at scale 1: 4 namespaces of 50 label sets (10
// apps x 5 tiers, a team per two apps), the even label sets with one
// endpoint and the odd ones with 9 (1,000 endpoints), 125 policies per
// namespace over 25 distinct peer selectors of the namespace.
const (
	peerNamespaces = 4
	peerApps       = policygen.PeerApps
	peerTiers      = policygen.PeerTiers
	peerLabelSets  = peerApps * peerTiers
	peerCrowd      = 9
	peerChanges    = 200
)

// BenchmarkPeerLabelChangeToKernel is the whole control plane
// (cells.ControlPlane) over real pinned maps in a private bpffs, with
// 1,000 local endpoints over 200 label sets registered through an
// embedder's endpoint source (endpoint.Registry.NewSource, Upsert), and
// 500 policies whose rules select their peers by label (fromEndpoints,
// toEndpoints: 100 distinct peer selectors), written into the `policies`
// table as the policy directory would (no policy file format has label
// peers yet). Run it as root:
//
//	make bench-peers
//	go test -run '^$' -bench PeerLabelChangeToKernel -benchtime 1x ./cells/
//
// It measures 200 label changes, one at a time: an endpoint that is
// alone in its label set gets a new version label (Upsert), so a new
// label identity replaces its old one, as a peer of every subject whose
// policies select it and as a subject. The time runs from the Upsert to
// both of:
//   - the source's WaitEnforced: the endpoints map gives the address the
//     new identity, its subject's policy and enforcement are in the
//     kernel, and the selectors had computed, and the policy writer
//     written, the entries of the tables as they were when the row came
//     (the new identity's entries as a peer of every subject included);
//   - the ipcache map gives the address the new identity
//     (Datapath.IPCacheStatus of its `ipcache` row, polled every 100 us;
//     the ipcache writer writes it only once the policy entries of its
//     identity are in the policy map: make before break).
//
// After each change (not timed) it checks the kernel: every `policy` row
// of the new identity is in its subject's policy map, the ipcache and
// endpoints maps give the new identity, and the old identity's peer
// entries are gone.
//
// It reports p50 and p99 (ns) of the whole (p50-ns, p99-ns) and of its
// parts (upsert-*: Upsert's return, enforced-*: WaitEnforced's);
// cpu-ns/change, the process's user and system CPU time (getrusage) over
// the 200 changes, checks included, per change; heap-B/labelset and
// heap-B/policy, the heap in use after GC with the endpoints less that of
// the started agent, per label set, and with the policies too less that
// without, per policy; entries, the `policy` table's rows.
//
// The baseline, in the same run: the same agent, endpoints and changes
// without the policies (base-*, and the ratios p50/base, p99/base,
// cpu/base): what a label change costs when no selector selects it.
func BenchmarkPeerLabelChangeToKernel(b *testing.B) {
	privileged.Test(b)
	var measured, base peerRun
	for range b.N {
		measured = runPeers(b, true)
		base = runPeers(b, false)
	}
	b.StopTimer()
	report := func(ds []time.Duration, name string) {
		b.ReportMetric(percentile(ds, 50), name+"p50-ns")
		b.ReportMetric(percentile(ds, 99), name+"p99-ns")
	}
	report(measured.total, "")
	report(measured.upsert, "upsert-")
	report(measured.enforced, "enforced-")
	report(base.total, "base-")
	b.ReportMetric(percentile(measured.total, 50)/percentile(base.total, 50), "p50/base")
	b.ReportMetric(percentile(measured.total, 99)/percentile(base.total, 99), "p99/base")
	b.ReportMetric(measured.cpuPerChange, "cpu-ns/change")
	b.ReportMetric(base.cpuPerChange, "base-cpu-ns/change")
	b.ReportMetric(measured.cpuPerChange/base.cpuPerChange, "cpu/base")
	b.ReportMetric(measured.heapPerLabelSet, "heap-B/labelset")
	b.ReportMetric(measured.heapPerPolicy, "heap-B/policy")
	b.ReportMetric(float64(measured.entries), "entries")
	b.ReportMetric(float64(measured.late), "late-checks")
}

// peerRun is what one run measured.
type peerRun struct {
	total, upsert, enforced        []time.Duration
	cpuPerChange                   float64
	heapPerLabelSet, heapPerPolicy float64
	entries                        int
	// late counts the changes whose kernel check found the `policy`
	// table and the policy map apart at first (see checkKernel).
	late int
}

// peerAgent is the control plane under measurement.
type peerAgent struct {
	hive      *hive.Hive
	log       *slog.Logger
	db        *statedb.DB
	policies  statedb.RWTable[*policy.Policy]
	entries   statedb.Table[*policy.Entry]
	ipcache   statedb.Table[*ipcachecell.Entry]
	endpoints statedb.Table[*endpoint.State]
	source    endpoint.Source
	datapath  *datapathcell.Datapath
	bpfRoot   string
}

// runPeers starts a fresh agent, registers the endpoints (and, with
// policies, the policies first), makes the label changes and measures
// each, then stops the agent.
func runPeers(b *testing.B, withPolicies bool) peerRun {
	b.StopTimer()
	a := startPeerAgent(b)
	defer a.stop(b)
	var run peerRun
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	started := liveHeap()
	eps := peerEndpoints()
	for _, ep := range eps {
		_, err := a.source.Upsert(ep.Endpoint)
		require.NoError(b, err)
	}
	for _, ep := range eps {
		require.NoError(b, a.source.WaitEnforced(ctx, ep.ID()))
	}
	withEndpoints := liveHeap()
	run.heapPerLabelSet = (float64(withEndpoints) - float64(started)) / (peerNamespaces * peerLabelSets)
	if withPolicies {
		policies := policygen.PeerPolicies(peerNamespaces)
		txn := a.db.WriteTxn(a.policies)
		for _, p := range policies {
			_, _, err := a.policies.Insert(txn, p)
			require.NoError(b, err)
		}
		txn.Commit()
		a.waitPoliciesEnforced(b, ctx, eps)
		run.heapPerPolicy = (float64(liveHeap()) - float64(withEndpoints)) / float64(len(policies))
		run.entries = a.entries.NumObjects(a.db.ReadTxn())
		require.NotZero(b, run.entries)
	}

	outer, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(a.bpfRoot), bpfmaps.PolicyName), &ebpf.LoadPinOptions{ReadOnly: true})
	require.NoError(b, err)
	defer outer.Close()

	// The endpoints alone in their label set: the even label sets' one.
	var movers []peerEndpoint
	for _, ep := range eps {
		if ep.labelSet%2 == 0 {
			movers = append(movers, ep)
		}
	}
	var cpu time.Duration
	for i := range peerChanges {
		ep := movers[i%len(movers)].Endpoint
		ep.Labels = peerLabels(movers[i%len(movers)].labelSet, fmt.Sprintf("v%d", 2+i))
		old := a.identityOf(b, ep)
		cpuBefore := cpuTime()
		b.StartTimer()
		start := time.Now()
		st, err := a.source.Upsert(ep)
		require.NoError(b, err)
		upserted := time.Now()
		require.NoError(b, a.source.WaitEnforced(ctx, ep.ID()))
		enforced := time.Now()
		a.waitIPCache(b, ctx, ep.Addresses[0], st.Identity)
		done := time.Now()
		b.StopTimer()
		cpu += cpuTime() - cpuBefore
		require.NotEqual(b, old, st.Identity, "a new label set, a new identity")
		run.total = append(run.total, done.Sub(start))
		run.upsert = append(run.upsert, upserted.Sub(start))
		run.enforced = append(run.enforced, enforced.Sub(start))
		if a.checkKernel(b, outer, ep.Addresses[0], old, st.Identity, withPolicies) {
			run.late++
		}
	}
	run.cpuPerChange = float64(cpu.Nanoseconds()) / peerChanges
	return run
}

func startPeerAgent(b *testing.B) *peerAgent {
	tmp := b.TempDir()
	a := &peerAgent{
		// Warnings and errors only: a line per endpoint would be
		// measured.
		log:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		bpfRoot: filepath.Join(tmp, "bpf"),
	}
	var registry endpoint.Registry
	a.hive = cells.NewHive(
		cells.ControlPlane,
		cell.Invoke(func(db *statedb.DB, pols statedb.Table[*policy.Policy], entries statedb.Table[*policy.Entry],
			ipc statedb.Table[*ipcachecell.Entry], eps statedb.Table[*endpoint.State], r endpoint.Registry, dp *datapathcell.Datapath) {
			// The policy cell hands out its table read-only, and has no
			// embedder's way in yet: without --policy-dir nothing else
			// writes it.
			a.db, a.policies, a.entries, a.ipcache, a.datapath = db, pols.(statedb.RWTable[*policy.Policy]), entries, ipc, dp
			a.endpoints, registry = eps, r
		}),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	a.hive.RegisterFlags(flags)
	require.NoError(b, flags.Parse([]string{
		"--bpf-root=" + a.bpfRoot,
		"--state-dir=" + filepath.Join(tmp, "state"),
		"--node-name=bench-node",
		"--cni-sock-path=",
		"--identity-restore-grace-period=0s",
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b, a.hive.Start(a.log, ctx))
	var err error
	a.source, err = registry.NewSource("bench")
	require.NoError(b, err)
	return a
}

func (a *peerAgent) stop(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b, a.hive.Stop(a.log, ctx))
	unix.Unmount(a.bpfRoot, unix.MNT_DETACH)
}

// waitPoliciesEnforced waits until the selectors computed the policies
// and the datapath wrote every entry (WaitEnforced of an endpoint waits
// for the tables as they were when its row changed, not later ones).
func (a *peerAgent) waitPoliciesEnforced(b *testing.B, ctx context.Context, eps []peerEndpoint) {
	for {
		pending := 0
		txn := a.db.ReadTxn()
		for e := range a.entries.All(txn) {
			if e.Status.Kind != reconciler.StatusKindDone {
				pending++
			}
		}
		if a.entries.NumObjects(txn) > 0 && pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("policy entries not written: %d pending", pending)
		case <-time.After(10 * time.Millisecond):
		}
	}
	for _, ep := range eps {
		require.NoError(b, a.source.WaitEnforced(ctx, ep.ID()))
	}
}

// identityOf returns the identity of ep's row.
func (a *peerAgent) identityOf(b *testing.B, ep endpoint.Endpoint) identity.Number {
	row, _, found := a.endpoints.Get(a.db.ReadTxn(), endpoint.NameIndex.Query(ep.ID()))
	require.True(b, found, "endpoint %s", ep.ID())
	return row.Identity
}

// waitIPCache waits until the ipcache map gives addr the identity id.
func (a *peerAgent) waitIPCache(b *testing.B, ctx context.Context, addr netip.Addr, id identity.Number) {
	prefix := netip.PrefixFrom(addr, addr.BitLen())
	for {
		row, rev, watch, found := a.ipcache.GetWatch(a.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))
		if found && row.Identity == id {
			for {
				kind, err := a.datapath.IPCacheStatus(rev)
				require.NotEqual(b, reconciler.StatusKindError, kind, "ipcache entry of %s: %v", prefix, err)
				if kind == reconciler.StatusKindDone {
					return
				}
				select {
				case <-ctx.Done():
					b.Fatalf("ipcache entry of %s not written", prefix)
				case <-time.After(100 * time.Microsecond):
				}
			}
		}
		select {
		case <-ctx.Done():
			b.Fatalf("no ipcache entry of %s with identity %d", prefix, id)
		case <-watch:
		}
	}
}

// checkKernel fails the benchmark unless the kernel has the change: the
// ipcache and endpoints maps give addr the identity id, every `policy`
// row of id is in its subject's policy map, and (once the policy writer
// deleted them, which follows the ipcache write) none of old's.
func (a *peerAgent) checkKernel(b *testing.B, outer *ebpf.Map, addr netip.Addr, old, id identity.Number, withPolicies bool) (late bool) {
	ipc, err := bpfmaps.ReadIPCache(a.bpfRoot)
	require.NoError(b, err)
	require.Equal(b, id, ipc[netip.PrefixFrom(addr, addr.BitLen())], "ipcache map entry of %s", addr)
	eps, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(a.bpfRoot), bpfmaps.EndpointsName), &ebpf.LoadPinOptions{ReadOnly: true})
	require.NoError(b, err)
	var v bpfmaps.EndpointValue
	require.NoError(b, eps.Lookup(bpfmaps.NewEndpointKey(addr), &v))
	eps.Close()
	require.Equal(b, id, v.Identity(), "endpoints map entry of %s", addr)

	// inMap counts the entries of identities id and old in subject's
	// policy map.
	inMap := func(subject identity.Number) (ofID, ofOld int) {
		inner, err := bpfmaps.PolicyOf(outer, subject)
		if err != nil {
			return 0, 0 // the subject's map is gone: none of its entries is in force
		}
		defer inner.Close()
		var k bpfmaps.PolicyKey
		var pv bpfmaps.PolicyValue
		it := inner.Iterate()
		for it.Next(&k, &pv) {
			switch ident, _, _, _ := k.Fields(); ident {
			case id:
				ofID++
			case old:
				ofOld++
			}
		}
		require.NoError(b, it.Err())
		return ofID, ofOld
	}
	// The `policy` table and the kernel agree once the policy writer
	// caught up. The new identity's entries are in the kernel by the time
	// the change is measured as done: if they are not at the first look,
	// the change is late. The old one's go after the ipcache write, and
	// are waited for.
	deadline := time.Now().Add(time.Minute)
	for attempt := 0; ; attempt++ {
		want := map[identity.Number]int{}
		for e := range policy.IdentityEntries(a.db.ReadTxn(), a.entries, id) {
			want[e.Key.Subject]++
		}
		if withPolicies {
			require.NotEmpty(b, want, "the new identity is a peer of some subject")
		}
		agree := true
		for subject, n := range want {
			got, ofOld := inMap(subject)
			if got != n && attempt == 0 {
				b.Logf("identity %d (was %d): %d policy map entries in subject %d, the `policy` table has %d", id, old, got, subject, n)
				late = true
			}
			agree = agree && got == n && ofOld == 0
		}
		if agree {
			return late
		}
		require.True(b, time.Now().Before(deadline), "identity %d's policy entries not in the kernel after a minute", id)
		time.Sleep(time.Millisecond)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peerEndpoint is one of the benchmark's endpoints with its label set.
type peerEndpoint struct {
	endpoint.Endpoint
	labelSet int
}

// peerEndpoints returns the 1,000 endpoints: label set s of namespace
// ns-n has app a-<s/5>, tier t-<s%5>, team team-<s/10> and version v1,
// one endpoint if s is even, 9 if odd.
func peerEndpoints() []peerEndpoint {
	var out []peerEndpoint
	addr := 0
	for n := range peerNamespaces {
		for s := range peerLabelSets {
			count := 1
			if s%2 == 1 {
				count = peerCrowd
			}
			for i := range count {
				out = append(out, peerEndpoint{Endpoint: endpoint.Endpoint{
					Namespace: fmt.Sprintf("ns-%d", n), Name: fmt.Sprintf("ep-%d-%d", s, i),
					Labels:    peerLabels(s, "v1"),
					Addresses: []netip.Addr{netip.AddrFrom4([4]byte{172, 16 + byte(addr>>16), byte(addr >> 8), byte(addr)})},
				}, labelSet: s})
				addr++
			}
		}
	}
	return out
}

// peerLabels are the labels of label set s with a version.
func peerLabels(s int, version string) map[string]string {
	app := s / peerTiers
	return map[string]string{"app": fmt.Sprintf("a-%d", app), "tier": fmt.Sprintf("t-%d", s%peerTiers),
		"team": fmt.Sprintf("team-%d", app/2), "version": version}
}
