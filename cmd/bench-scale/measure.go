// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// convergeTimeout bounds every wait: a scenario that does not converge in
// this time is a failure, not a figure.
const convergeTimeout = 5 * time.Minute

// result holds one scenario's figures.
type result struct {
	scenario scenario

	floorRandom, floorSorted time.Duration // step 1
	// floorRandomCPU and endToEndCPU are the process's CPU time (user and
	// system) in step 1's random-order write and in step 2: on a machine
	// shared with other work, their ratio moves less than the times'.
	floorRandomCPU, endToEndCPU time.Duration
	restartCPU                  time.Duration // the same, of step 3
	// tableInsert is a second, in-process floor: inserting the N entries
	// straight into a table like `ipcache` (in 4096-row transactions),
	// with nothing else. Each prefix costs three tables and a status
	// write-back in the agent: this bounds how close to the kernel's
	// floor a design on statedb can come.
	tableInsert   time.Duration
	endToEnd      time.Duration // step 2
	heapPerPrefix float64       // step 5, bytes
	// restartHeapPerPrefix is the heap of step 3's agent, measured as
	// step 5's is: what an agent holds during the grace period after a
	// restart (the owner's rows, and restore's previous numbers), per
	// prefix.
	restartHeapPerPrefix float64

	restart                time.Duration // step 3
	restartWrites          uint64        // map writes during step 3
	restartUnchangedWrites uint64        // of which the map already held the value
	restartSkipped         uint64        // writes skipped because the map held the value
	restartRenumbered      int           // prefixes whose identity changed

	graceRelease      time.Duration // step 4
	idleP99, graceP99 time.Duration // until in the datapath
	graceTableP99     time.Duration // until in the `ipcache` table
	idleN, graceN     int
}

func (r result) endToEndRatio() float64 { return ratio(r.endToEnd, r.floorRandom) }
func (r result) restartRatio() float64  { return ratio(r.restart, r.endToEnd) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// keys returns n distinct random prefixes: IPv4 /32, or for "mixed" half
// IPv4 /32 and half IPv6 /128 (in 2001:db8::/32). Seeded: every run
// measures the same keys.
func keys(s scenario) []netip.Prefix {
	rng := rand.New(rand.NewPCG(42, uint64(s.n)))
	seen := make(map[netip.Addr]struct{}, s.n)
	out := make([]netip.Prefix, 0, s.n)
	for len(out) < s.n {
		var addr netip.Addr
		if s.family == "mixed" && len(out)%2 == 1 {
			var a [16]byte
			a[0], a[1], a[2], a[3] = 0x20, 0x01, 0x0d, 0xb8
			for i := 4; i < 16; i += 4 {
				v := rng.Uint32()
				a[i], a[i+1], a[i+2], a[i+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
			}
			addr = netip.AddrFrom16(a)
		} else {
			v := rng.Uint32()
			addr = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		}
		if _, dup := seen[addr]; dup {
			continue
		}
		seen[addr] = struct{}{}
		out = append(out, netip.PrefixFrom(addr, addr.BitLen()))
	}
	return out
}

// floor writes the prefixes with one raw BatchUpdate into a fresh LPM trie
// of the ipcache map's layout, in the given order; it returns the time
// and the CPU time of the write.
func floor(prefixes []netip.Prefix) (elapsed, cpu time.Duration, err error) {
	m, err := ebpf.NewMap(bpfmaps.IPCacheSpec(uint32(len(prefixes))))
	if err != nil {
		return 0, 0, fmt.Errorf("create LPM trie for the floor: %w", err)
	}
	defer m.Close()
	ks := make([]bpfmaps.IPCacheKey, len(prefixes))
	vs := make([]bpfmaps.IPCacheValue, len(prefixes))
	for i, p := range prefixes {
		ks[i], vs[i] = bpfmaps.NewIPCacheKey(p), bpfmaps.NewIPCacheValue(identity.Number(i+1))
	}
	cpuStart, start := cpuTime(), time.Now()
	n, err := m.BatchUpdate(ks, vs, nil)
	elapsed, cpu = time.Since(start), cpuTime()-cpuStart
	if err != nil || n != len(prefixes) {
		return 0, 0, fmt.Errorf("batch update the floor's LPM trie: wrote %d of %d: %w", n, len(prefixes), err)
	}
	return elapsed, cpu, nil
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tableInsertFloor inserts an entry per prefix into a fresh `ipcache`
// table, in transactions of 4096 rows.
func tableInsertFloor(prefixes []netip.Prefix) (time.Duration, error) {
	db := statedb.New()
	entries, err := ipcachecell.NewEntriesTable(db)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for first := 0; first < len(prefixes); first += 4096 {
		txn := db.WriteTxn(entries)
		for _, p := range prefixes[first:min(first+4096, len(prefixes))] {
			if _, _, err := entries.Insert(txn, ipcachecell.NewEntry(p, identity.MinLocal, source.Local)); err != nil {
				txn.Abort()
				return 0, fmt.Errorf("insert into the table for the floor: %w", err)
			}
		}
		txn.Commit()
	}
	return time.Since(start), nil
}

func measure(s scenario, bpfRoot, stateDir string, log *slog.Logger) (result, error) {
	r := result{scenario: s}
	prefixes := keys(s)
	var err error

	// 1. The floor, in random order and, for reference, in address order.
	if r.floorRandom, r.floorRandomCPU, err = floor(prefixes); err != nil {
		return r, err
	}
	sorted := slices.SortedFunc(slices.Values(prefixes), func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if r.floorSorted, _, err = floor(sorted); err != nil {
		return r, err
	}
	sorted = nil
	if r.tableInsert, err = tableInsertFloor(prefixes); err != nil {
		return r, err
	}

	batch := make([]ipcachecell.PrefixUpsert, len(prefixes))
	for i, p := range prefixes {
		batch[i] = ipcachecell.PrefixUpsert{Prefix: p}
	}
	cfg := agentConfig{
		bpfRoot:     bpfRoot,
		stateDir:    stateDir,
		maxEntries:  uint32(s.n + s.n/4 + 1024),
		gracePeriod: time.Hour,
		withOwner:   true,
	}

	// 2. End to end, from an idle started agent; 5. its heap after.
	// heapInUse starts from a collected heap (freshStart), as the steps
	// after do.
	heapBefore := heapInUse()
	first, err := startAgent(cfg, log)
	if err != nil {
		return r, err
	}
	owner, err := first.ipcache.NewHandle(ownerResource, source.Local)
	if err != nil {
		return r, err
	}
	stopProfile, err := startStepProfile(&e2eProfile)
	if err != nil {
		return r, err
	}
	cpuStart, start := cpuTime(), time.Now()
	if err := owner.UpsertBatch(batch); err != nil {
		stopProfile()
		return r, err
	}
	first.ownerDone()
	err = first.waitReconciled(uint64(s.n), convergeTimeout)
	r.endToEnd, r.endToEndCPU = time.Since(start), cpuTime()-cpuStart
	stopProfile()
	if err != nil {
		return r, err
	}
	if r.heapPerPrefix, err = first.heapPerPrefix(heapBefore, s.n); err != nil {
		return r, err
	}
	// The owner's handle is part of what an agent holds for its prefixes;
	// unused after the upsert, it would be collected before the heap is
	// measured.
	runtime.KeepAlive(owner)
	if heapProfile != "" {
		if err := writeProfile("heap", heapProfile); err != nil {
			return r, err
		}
		heapProfile = ""
	}
	if err := first.stop(); err != nil {
		return r, err
	}
	if endToEndOnly {
		return r, nil
	}
	before, err := pinnedMatches(bpfRoot, prefixes)
	if err != nil {
		return r, fmt.Errorf("check pinned map after end to end: %w", err)
	}

	// 3. Restart, the owner re-asserting the same prefixes.
	heapBefore = heapInUse()
	stopProfile, err = startStepProfile(&restartProfile)
	if err != nil {
		return r, err
	}
	defer stopProfile() // at the latest
	cpuStart, start = cpuTime(), time.Now()
	second, err := startAgent(cfg, log)
	if err != nil {
		return r, err
	}
	owner, err = second.ipcache.NewHandle(ownerResource, source.Local)
	if err != nil {
		return r, err
	}
	if err := owner.UpsertBatch(batch); err != nil {
		return r, err
	}
	second.ownerDone()
	if err := second.waitInitialized(convergeTimeout); err != nil {
		return r, err
	}
	if err := second.waitReconciled(uint64(s.n), convergeTimeout); err != nil {
		return r, err
	}
	r.restart, r.restartCPU = time.Since(start), cpuTime()-cpuStart
	stopProfile()
	if r.restartHeapPerPrefix, err = second.heapPerPrefix(heapBefore, s.n); err != nil {
		return r, err
	}
	runtime.KeepAlive(owner)
	written, skipped := second.datapath.MapWrites(bpfmaps.IPCacheName)
	r.restartWrites, r.restartSkipped = written, skipped
	if err := second.stop(); err != nil {
		return r, err
	}
	after, err := pinnedMatches(bpfRoot, prefixes)
	if err != nil {
		return r, fmt.Errorf("check pinned map after restart: %w", err)
	}
	for p, id := range before {
		if after[p] != id {
			r.restartRenumbered++
		}
	}
	// Every key was written at most once; those whose value changed are
	// the renumbered ones, the others were written with the value the map
	// already held.
	r.restartUnchangedWrites = written - min(written, uint64(r.restartRenumbered))

	// 4. Grace expiry: nobody re-asserts; the grace period is long enough
	// for the restored prefixes to be resolved and reconciled first.
	cfg.withOwner = false
	cfg.gracePeriod = r.restart + 3*time.Second
	if err := graceExpiry(&r, cfg, log); err != nil {
		return r, err
	}
	return r, nil
}

// graceExpiry runs step 4.
func graceExpiry(r *result, cfg agentConfig, log *slog.Logger) error {
	freshStart()
	third, err := startAgent(cfg, log)
	if err != nil {
		return err
	}
	defer third.stop()
	select { // the grace period starts once the pinned map is restored
	case <-third.restorer.Restored():
	case <-time.After(convergeTimeout):
		return errors.New("timed out waiting for restore")
	}
	releaseAt := time.Now().Add(third.restorer.Status().TimeLeft)
	if err := third.waitInitialized(convergeTimeout); err != nil {
		return err
	}
	if err := third.waitReconciled(uint64(r.scenario.n), convergeTimeout); err != nil {
		return err
	}
	if time.Now().After(releaseAt) {
		return fmt.Errorf("grace period of %s expired before the restored prefixes were reconciled", cfg.gracePeriod)
	}

	unrelated, err := third.ipcache.NewHandle("bench/unrelated", source.Local)
	if err != nil {
		return err
	}
	sampler := &upsertSampler{agent: third, handle: unrelated}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sampler.run(done)
	}()

	// Released: the map's reconciler deleted the n restored keys (and
	// wrote the unrelated ones), the table holds only the unrelated, and
	// restore says it is done (it un-withholds the numbers last).
	written0, _ := third.datapath.MapWrites(bpfmaps.IPCacheName)
	err = waitFor("the restored prefixes released", convergeTimeout+cfg.gracePeriod, func() bool {
		written, _ := third.datapath.MapWrites(bpfmaps.IPCacheName)
		upserted := sampler.count()
		return written-written0 >= uint64(r.scenario.n+upserted) &&
			third.entries.NumObjects(third.db.ReadTxn()) <= upserted &&
			third.restorer.Status().Released // last: it counts rows until released
	})
	releasedAt := time.Now()
	close(done)
	wg.Wait()
	if err != nil {
		return err
	}
	if sampler.err != nil {
		return sampler.err
	}
	r.graceRelease = releasedAt.Sub(releaseAt)
	idle, during := sampler.split(releaseAt, releasedAt)
	latency := func(sm sample) time.Duration { return sm.latency }
	toTable := func(sm sample) time.Duration { return sm.toTable }
	r.idleP99, r.idleN = p99(idle, latency), len(idle)
	r.graceP99, r.graceN = p99(during, latency), len(during)
	r.graceTableP99 = p99(during, toTable)
	return nil
}

// upsertSampler upserts one fresh prefix at a time and measures how long
// until the datapath has it: the entry is in the `ipcache` table and its
// reconciler says it is written to the map.
type upsertSampler struct {
	agent  *agent
	handle *ipcachecell.Handle

	mu      sync.Mutex
	samples []sample
	err     error
}

type sample struct {
	at      time.Time
	latency time.Duration // until the datapath has it
	toTable time.Duration // until the `ipcache` table has it
}

func (s *upsertSampler) run(done <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		case <-time.After(5 * time.Millisecond):
		}
		// fd00::/8 holds none of the benchmark's own prefixes.
		prefix := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}), 128)
		start := time.Now()
		if err := s.handle.Upsert(prefix, ipcachecell.Metadata{}); err != nil {
			s.mu.Lock()
			s.err = fmt.Errorf("upsert unrelated prefix: %w", err)
			s.mu.Unlock()
			return
		}
		var toTable time.Duration
		for {
			inTable, inDatapath := s.state(prefix)
			if inTable && toTable == 0 {
				toTable = time.Since(start)
			}
			if inDatapath {
				break
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
		s.mu.Lock()
		s.samples = append(s.samples, sample{at: start, latency: time.Since(start), toTable: toTable})
		s.mu.Unlock()
	}
}

// state says whether the prefix is in the `ipcache` table, and whether the
// reconciler wrote it to the map.
func (s *upsertSampler) state(prefix netip.Prefix) (inTable, inDatapath bool) {
	_, rev, found := s.agent.entries.Get(s.agent.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))
	if !found {
		return false, false
	}
	kind, _ := s.agent.datapath.IPCacheStatus(rev)
	return true, kind == reconciler.StatusKindDone
}

func (s *upsertSampler) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.samples)
}

// split returns the latencies of the upserts made before the release, and
// of those made during it.
func (s *upsertSampler) split(releaseAt, releasedAt time.Time) (idle, during []sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sm := range s.samples {
		switch {
		case sm.at.Before(releaseAt):
			idle = append(idle, sm)
		case sm.at.Before(releasedAt):
			during = append(during, sm)
		}
	}
	return idle, during
}

// p99 returns the 99th percentile of what of returns for the samples.
func p99(samples []sample, of func(sample) time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	latencies := make([]time.Duration, len(samples))
	for i, sm := range samples {
		latencies[i] = of(sm)
	}
	slices.Sort(latencies)
	return latencies[min(len(latencies)-1, len(latencies)*99/100)]
}

// pinnedMatches reads the pinned ipcache map and checks that it holds
// exactly the prefixes; it returns their identities.
func pinnedMatches(bpfRoot string, prefixes []netip.Prefix) (map[netip.Prefix]identity.Number, error) {
	pinned, err := bpfmaps.ReadIPCache(bpfRoot)
	if err != nil {
		return nil, err
	}
	if len(pinned) != len(prefixes) {
		return nil, fmt.Errorf("pinned ipcache map holds %d entries, want %d", len(pinned), len(prefixes))
	}
	for _, p := range prefixes {
		if _, ok := pinned[p]; !ok {
			return nil, fmt.Errorf("pinned ipcache map lacks %s", p)
		}
	}
	return pinned, nil
}

// freshStart collects the previous agent's heap before the next step's
// agent starts, as step 2 starts from a collected heap (heapInUse): a
// restart is a new process, which holds nothing of the agent before it.
// A stopped agent's heap is garbage, but part of it (objects with
// finalizers, and all they reach) outlives the first collection. Left
// uncollected, it counted as live while the next agent started: it set
// the heap goal that agent grew to at twice the stopped agent's heap, and
// the agent grew onto fresh pages meanwhile (docs/SCALE.md, "The restart
// step starts from a collected heap").
// Its pages are not returned to the operating system, as they are not
// before step 2: both steps reuse the pages of what ran before them.
func freshStart() {
	runtime.GC()
	runtime.GC()
}

func heapInUse() int64 {
	freshStart()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// writeProfile writes the named runtime/pprof profile (heap, mutex) to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s profile: %w", name, err)
	}
	defer f.Close()
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		return fmt.Errorf("write %s profile: %w", name, err)
	}
	return nil
}

// startStepProfile starts a step's CPU profile (-e2e-cpuprofile,
// -restart-cpuprofile) into *path, if set and not yet written, and returns
// what stops it. A CPU profile of the whole run (-cpuprofile) is the other
// choice: the two cannot run at once.
func startStepProfile(path *string) (stop func(), err error) {
	if *path == "" {
		return func() {}, nil
	}
	f, err := os.Create(*path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		return nil, fmt.Errorf("step CPU profile: %w", err)
	}
	*path = ""
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		f.Close()
	}), nil
}
