// SPDX-License-Identifier: Apache-2.0

package cells_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
)

// The shape of BenchmarkEndpointFileToKernel.
const (
	benchEndpoints = 1_000
	benchLabelSets = 100
	// benchKeys label keys, each with benchValues values: a policy per
	// key and value, benchKeys policies per label set.
	benchKeys   = 10
	benchValues = 10
)

// BenchmarkEndpointFileToKernel is the whole control plane
// (cells.ControlPlane) over real pinned maps in a private bpffs, with
// --policy-dir and --endpoint-dir in temporary directories. It measures,
// for each of 1,000 endpoints over 100 label sets, the time from its
// endpoint file written (renamed into --endpoint-dir) to its policy in
// the kernel: the endpoints map entry of its address, its subject's
// policy map entries and enforcement entries, as the datapath's
// WaitEnforced (what the CNI plugin's ADD waits on) says. Run it as root:
//
//	make bench-endpoints
//	go test -run '^$' -bench EndpointFileToKernel -benchtime 1x ./cells/
//
// (-cpuprofile profiles it). One op is the whole run; b.N is 1 at the
// default -benchtime.
//
// The policies: 100, in 10 files (one per label key g0..g9), each with
// a selector g<k>: v<n> and one CIDR rule in each direction (a /24 of its
// own, TCP/443 out); label set s has a value for each key (g0 = s mod 10,
// g1 = s / 10, g<k> = (g0 + k·g1) mod 10), so that every endpoint is
// selected by 10 policies, each policy selects 10 label sets, and no two
// label sets have the same policies (100 subjects of 20 entries each).
// Endpoint i (one file each, one address) has label set i/10: every
// tenth endpoint is the first of its label set, whose label identity and
// subject policy are new. The files are written one at a time, each once
// the previous one is enforced.
//
// It reports, in ns, p50 and p99 of: file to kernel (p50-ns, p99-ns);
// the `endpoints` row to the kernel (row-*: the datapath's part, after
// the endpoint cell registered the endpoint; file to row is the
// directory's, its 100 ms debounce and a read of the whole directory);
// row to kernel of the first endpoints of a label set alone
// (new-set-row-*), with the ratio of its p50 to the baseline's row to
// kernel p50 (new-set-row-p50/base: what a new label identity and its
// subject's policy cost). Memory: heap-B/endpoint, the heap in use after
// GC with the 1,000 endpoints less that with none, per endpoint;
// kernel-B/endpoint, the same of the memlock of the ipcache, endpoints
// and policy maps and the subjects' policy maps.
//
// The baseline, in the same run: the same 1,000 endpoints on a fresh
// agent where one endpoint of each label set (its anchor, in a file
// written and enforced before the measurement) already holds the label
// identity, whose subject policy is in the kernel: base-* and the ratios
// p50/base, p99/base, row-p50/base and row-p99/base. It is what an
// endpoint costs when only its own entry has to be written; figures on a
// shared machine are meaningful only as such ratios.
func BenchmarkEndpointFileToKernel(b *testing.B) {
	privileged.Test(b)
	var measured, base endpointRun
	for range b.N {
		measured = runEndpoints(b, false)
		base = runEndpoints(b, true)
	}
	b.StopTimer()
	report := func(ds []time.Duration, name string) {
		b.ReportMetric(percentile(ds, 50), name+"p50-ns")
		b.ReportMetric(percentile(ds, 99), name+"p99-ns")
	}
	report(measured.fileToKernel, "")
	report(measured.rowToKernel, "row-")
	report(measured.newSetRow, "new-set-row-")
	report(base.fileToKernel, "base-")
	report(base.rowToKernel, "base-row-")
	ratio := func(a, base []time.Duration, p int, name string) {
		b.ReportMetric(percentile(a, p)/percentile(base, p), name)
	}
	ratio(measured.fileToKernel, base.fileToKernel, 50, "p50/base")
	ratio(measured.fileToKernel, base.fileToKernel, 99, "p99/base")
	ratio(measured.rowToKernel, base.rowToKernel, 50, "row-p50/base")
	ratio(measured.rowToKernel, base.rowToKernel, 99, "row-p99/base")
	ratio(measured.newSetRow, base.rowToKernel, 50, "new-set-row-p50/base")
	b.ReportMetric(measured.heapPerEndpoint, "heap-B/endpoint")
	b.ReportMetric(measured.kernelPerEndpoint, "kernel-B/endpoint")
}

// endpointRun is what one run measured.
type endpointRun struct {
	// fileToKernel and rowToKernel are every endpoint's times;
	// newSetRow the row to kernel times of the first endpoint of each
	// label set.
	fileToKernel, rowToKernel, newSetRow []time.Duration
	heapPerEndpoint                      float64
	kernelPerEndpoint                    float64
}

// benchAgent is the control plane under measurement.
type benchAgent struct {
	hive        *hive.Hive
	log         *slog.Logger
	db          *statedb.DB
	endpoints   statedb.Table[*endpoint.State]
	policies    statedb.Table[*policy.Policy]
	enforcement statedb.Table[*policy.Enforcement]
	restorer    *restorecell.Restorer
	datapath    *datapathcell.Datapath
	bpfRoot     string
	endpointDir string
}

// runEndpoints starts a fresh agent with the policies, writes the
// endpoint files one at a time and measures each (anchors: first one
// endpoint per label set, not measured), then stops the agent.
func runEndpoints(b *testing.B, anchors bool) endpointRun {
	b.StopTimer()
	a := startBenchAgent(b)
	defer a.stop(b)
	a.waitPoliciesInKernel(b)
	anchored := 0
	if anchors {
		anchored = benchLabelSets
		var docs []string
		for s := range benchLabelSets {
			docs = append(docs, endpointDoc(fmt.Sprintf("anchor-%03d", s), s, 1<<12+s))
		}
		a.writeFile(b, "anchors.yaml", strings.Join(docs, "---\n"))
		for s := range benchLabelSets {
			a.waitEnforced(b, fmt.Sprintf("anchor-%03d", s))
		}
	}
	heapBefore, kernelBefore := liveHeap(), a.kernelMaps(b)

	var run endpointRun
	b.StartTimer()
	for i := range benchEndpoints {
		name := fmt.Sprintf("ep-%04d", i)
		start := time.Now()
		a.writeFile(b, name+".yaml", endpointDoc(name, i/(benchEndpoints/benchLabelSets), i))
		atRow := a.waitEnforced(b, name)
		done := time.Now()
		run.fileToKernel = append(run.fileToKernel, done.Sub(start))
		run.rowToKernel = append(run.rowToKernel, done.Sub(atRow))
		if i%(benchEndpoints/benchLabelSets) == 0 {
			run.newSetRow = append(run.newSetRow, done.Sub(atRow))
		}
	}
	b.StopTimer()

	heapAfter, kernelAfter := liveHeap(), a.kernelMaps(b)
	kernelAfter.check(b, len(run.fileToKernel)+anchored)
	run.heapPerEndpoint = (float64(heapAfter) - float64(heapBefore)) / benchEndpoints
	run.kernelPerEndpoint = (float64(kernelAfter.memlock) - float64(kernelBefore.memlock)) / benchEndpoints
	return run
}

func startBenchAgent(b *testing.B) *benchAgent {
	tmp := b.TempDir()
	a := &benchAgent{
		// Warnings and errors only: a line per endpoint would be
		// measured, and kept.
		log:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		bpfRoot:     filepath.Join(tmp, "bpf"),
		endpointDir: filepath.Join(tmp, "endpoints"),
	}
	policyDir := filepath.Join(tmp, "policies")
	require.NoError(b, os.Mkdir(policyDir, 0o700))
	require.NoError(b, os.Mkdir(a.endpointDir, 0o700))
	for k := range benchKeys {
		require.NoError(b, os.WriteFile(filepath.Join(policyDir, fmt.Sprintf("g%d.yaml", k)), policyFile(k), 0o600))
	}
	a.hive = cells.NewHive(
		cells.ControlPlane,
		cell.Invoke(func(db *statedb.DB, eps statedb.Table[*endpoint.State], pols statedb.Table[*policy.Policy],
			enf statedb.Table[*policy.Enforcement], r *restorecell.Restorer, dp *datapathcell.Datapath) {
			a.db, a.endpoints, a.policies, a.enforcement, a.restorer, a.datapath = db, eps, pols, enf, r, dp
		}),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	a.hive.RegisterFlags(flags)
	require.NoError(b, flags.Parse([]string{
		"--bpf-root=" + a.bpfRoot,
		"--state-dir=" + filepath.Join(tmp, "state"),
		"--policy-dir=" + policyDir,
		"--endpoint-dir=" + a.endpointDir,
		"--node-name=bench-node",
		"--cni-sock-path=",
		// A fresh bpffs restores nothing: nothing to withhold.
		"--identity-restore-grace-period=0s",
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b, a.hive.Start(a.log, ctx))
	return a
}

func (a *benchAgent) stop(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b, a.hive.Stop(a.log, ctx))
	unix.Unmount(a.bpfRoot, unix.MNT_DETACH)
}

// waitPoliciesInKernel waits until the 100 policies are in force, their
// CIDRs' identities are in the ipcache map, and the tables the endpoints
// are written after are initialized.
func (a *benchAgent) waitPoliciesInKernel(b *testing.B) {
	deadline := time.Now().Add(time.Minute)
	for {
		txn := a.db.ReadTxn()
		written, unchanged := a.datapath.MapWrites(bpfmaps.IPCacheName)
		epsInit, _ := a.endpoints.Initialized(txn)
		enfInit, _ := a.enforcement.Initialized(txn)
		if a.policies.NumObjects(txn) == benchKeys*benchValues && written+unchanged >= 2*benchKeys*benchValues &&
			epsInit && enfInit && a.restorer.Status().Released {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("policies not in the kernel after a minute: %d policies, %d ipcache map writes",
				a.policies.NumObjects(txn), written+unchanged)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writeFile writes a file of the endpoint directory atomically (a hidden
// temporary file, which the directory ignores, renamed into place).
func (a *benchAgent) writeFile(b *testing.B, name, content string) {
	tmp := filepath.Join(a.endpointDir, "."+name)
	require.NoError(b, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(b, os.Rename(tmp, filepath.Join(a.endpointDir, name)))
}

// waitEnforced waits, on the `endpoints` table's watch channel, for the
// endpoint's row, then for the datapath to have it in the kernel. It
// returns when the row appeared.
func (a *benchAgent) waitEnforced(b *testing.B, name string) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := benchNamespace + "/" + name
	for {
		row, rev, watch, found := a.endpoints.GetWatch(a.db.ReadTxn(), endpoint.NameIndex.Query(id))
		if found && row.Identity != 0 {
			atRow := time.Now()
			require.NoError(b, a.datapath.WaitEnforced(ctx, id, rev), "endpoint %s", id)
			return atRow
		}
		select {
		case <-watch:
		case <-ctx.Done():
			b.Fatalf("endpoint %s: no row after a minute", id)
		}
	}
}

// kernelMaps is what the maps endpoints add entries to hold: the sum of
// their memlock (the kernel's estimate of a map's memory: ipcache,
// endpoints, the outer policy map and every subject's policy map), the
// endpoints map's entries, and the entries of each subject's policy map.
type kernelMaps struct {
	memlock   uint64
	endpoints int
	subjects  map[uint32]int
}

func (a *benchAgent) kernelMaps(b *testing.B) kernelMaps {
	km := kernelMaps{subjects: map[uint32]int{}}
	open := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(a.bpfRoot), name), &ebpf.LoadPinOptions{ReadOnly: true})
		require.NoError(b, err)
		return m
	}
	// count adds m's memlock and returns its number of entries.
	count := func(m *ebpf.Map) int {
		defer m.Close()
		info, err := m.Info()
		require.NoError(b, err)
		memlock, _ := info.Memlock()
		km.memlock += memlock
		n := 0
		key, value := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		iter := m.Iterate()
		for iter.Next(key, value) {
			n++
		}
		require.NoError(b, iter.Err())
		return n
	}
	count(open(bpfmaps.IPCacheName))
	km.endpoints = count(open(bpfmaps.EndpointsName))
	outer := open(bpfmaps.PolicyName)
	var subjects []uint32
	var subject, innerID uint32
	iter := outer.Iterate()
	for iter.Next(&subject, &innerID) {
		subjects = append(subjects, subject)
	}
	require.NoError(b, iter.Err())
	for _, subject := range subjects {
		inner, err := bpfmaps.PolicyOf(outer, identity.Number(subject))
		require.NoError(b, err)
		km.subjects[subject] = count(inner)
	}
	count(outer) // closes it
	return km
}

// check fails the benchmark unless the maps hold what the run wrote: an
// endpoints entry per endpoint, and each label set's subject with its
// 10 policies' entries, one per direction.
func (km kernelMaps) check(b *testing.B, endpoints int) {
	require.Equal(b, endpoints, km.endpoints, "endpoints map entries")
	delete(km.subjects, 0) // the host-wide default's: no policy selects it
	require.Len(b, km.subjects, benchLabelSets, "subjects in the policy map")
	for subject, entries := range km.subjects {
		require.Equal(b, 2*benchKeys, entries, "policy map entries of subject %d", subject)
	}
}

const benchNamespace = "bench"

// labelValue is label set s's value of key k (see the benchmark's doc).
func labelValue(s, k int) int {
	low, high := s%benchValues, s/benchValues
	switch k {
	case 0:
		return low
	case 1:
		return high
	}
	return (low + k*high) % benchValues
}

// endpointDoc is a native Endpoint document of label set s with the
// address 172.16.0.0 + addr.
func endpointDoc(name string, s, addr int) string {
	lbls := []string{fmt.Sprintf("set: s%d", s)}
	for k := range benchKeys {
		lbls = append(lbls, fmt.Sprintf("g%d: v%d", k, labelValue(s, k)))
	}
	return fmt.Sprintf("apiVersion: ipcache-agent.io/v1\nkind: Endpoint\n"+
		"metadata: {name: %s, namespace: %s, labels: {%s}}\nspec: {addresses: [172.16.%d.%d]}\n",
		name, benchNamespace, strings.Join(lbls, ", "), addr>>8&0xff, addr&0xff)
}

// policyFile is the policy file of key k: a native policy per value,
// selecting g<k>: v<n>, allowing in from 10.<k>.<n>.0/24 and out to
// TCP/443 of 10.<100+k>.<n>.0/24.
func policyFile(k int) []byte {
	var docs []string
	for n := range benchValues {
		docs = append(docs, fmt.Sprintf("name: g%d-v%d\nendpointSelector: {matchLabels: {g%d: v%d}}\n"+
			"ingress:\n  - fromCIDR: [10.%d.%d.0/24]\n"+
			"egress:\n  - toCIDR: [10.%d.%d.0/24]\n    toPorts: [{port: 443, protocol: TCP}]\n",
			k, n, k, n, k, n, 100+k, n))
	}
	return []byte(strings.Join(docs, "---\n"))
}

// liveHeap returns the heap in use after garbage collection (two cycles:
// what finalizers freed in the first goes in the second).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// percentile returns the p-th percentile of ds in ns (nearest rank).
func percentile(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(ds))
	rank := (p*len(sorted) + 99) / 100
	return float64(sorted[max(rank, 1)-1].Nanoseconds())
}
