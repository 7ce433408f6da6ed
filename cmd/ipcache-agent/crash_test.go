// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

const (
	// crashSeedEnv sets the seed of TestPrivilegedCrashSafety, to replay
	// the policy sets and kill moments of a failed run.
	crashSeedEnv = "IPCACHE_AGENT_CRASH_SEED"

	crashIterations  = 9 // every combination of an early and a late kill
	crashPolicyFiles = 240
	// crashGrace is long enough for the policy set to converge within it
	// on two loaded cores under -race (docs/SCALE.md), so that kills
	// land in the grace period after convergence.
	crashGrace = 2 * time.Second
	// crashWait bounds every wait for the agent (convergence, release),
	// generous for -race on two loaded cores.
	crashWait = 30 * time.Second
	// releaseWindow: a kill this close to the end of the grace period
	// counts as a kill during the release.
	releaseWindow = 300 * time.Millisecond

	msgRestored    = "Restored prefixes from the pinned ipcache map"
	msgReleased    = "Restore grace period over"
	msgInitialized = "ipcache table initialized"
)

// The phases of an agent run a kill lands in, as observed.
const (
	phaseRestore      = "restore"       // the agent had not logged its restore yet
	phaseConvergence  = "convergence"   // restored; the map not yet the desired state
	phaseGrace        = "grace"         // converged; restored prefixes held
	phaseRelease      = "release"       // within releaseWindow of the grace period's end
	phaseAfterRelease = "after-release" // released: the map is the policy set
)

// TestPrivilegedCrashSafety runs real agent processes over one bpffs mount,
// state directory and policy directory (a few hundred files, a few
// thousand CIDRs), and SIGKILLs them at seeded random moments: during
// restore, during the convergence of the policy set, during the grace
// period and around its end, and after the release. The policy set changes
// between some runs, so that restored prefixes are not re-asserted and go
// when the grace period ends.
//
// While each agent runs, a sampler walks the pinned ipcache map every
// ~10 ms: a prefix that the previous run left and that is still in the
// policy set is never absent and never changes number; any prefix the
// previous run left stays, with its number, until the grace period can
// have ended; nothing is in the map that is neither wanted nor restored; a
// new prefix keeps its number. (A walk of an LPM trie being written can
// miss entries, so what a walk does not show is looked up on its own
// before it counts.) Meanwhile the identity checkpoint is read whenever
// it changes: whenever it exists it parses. After each kill the map (quiet
// now) is checked exactly; after each restart the map must converge to
// the policy set plus what was restored, the checkpoint must come to name
// every identity in the map, and after the release the map must be the
// policy set alone. A last run stops cleanly: its checkpoint names exactly
// the identities in the map.
func TestPrivilegedCrashSafety(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, crashSeedEnv)
	}
	t.Logf("seed %d (replay with %s=%d)", seed, crashSeedEnv, seed)
	began := time.Now()
	r := newCrashRig(t, seed)
	t.Cleanup(func() {
		t.Logf("%d iterations, %d agent runs in %s; kills by observed phase %v (planned %v)",
			r.iterations, r.runs, time.Since(began).Round(time.Millisecond), r.killed, r.planned)
		t.Logf("policy set at the end: %d files, %d prefixes; %d policy-set changes; %d restored prefixes released unwanted",
			len(r.inForce), len(r.wanted()), r.mutations, r.releasedUnwanted)
		t.Logf("samples: %d map walks (%s each), %d failed; %d checks of a previous run's prefix, %d exact lookups "+
			"where the walk did not show it, %d of them found it; checkpoint: looked at %d times, %d versions read and parsed",
			r.walks.Load(), time.Duration(r.sampleTime.Load()/max(1, r.walks.Load())).Round(time.Microsecond), r.walkErrors.Load(),
			r.checked.Load(), r.lookups.Load(), r.walkMisses.Load(), r.checkpointLooks.Load(), r.checkpointReads.Load())
	})

	// Every combination of an early kill (or none) and a late kill, in a
	// seeded order; the phase a kill lands in is what was observed.
	type plan struct{ early, late string }
	var plans []plan
	for _, early := range []string{phaseRestore, phaseConvergence, ""} {
		for _, late := range []string{phaseGrace, phaseRelease, phaseAfterRelease} {
			plans = append(plans, plan{early, late})
		}
	}
	for len(plans) < crashIterations {
		plans = append(plans, plan{[]string{phaseRestore, phaseConvergence}[r.rng.IntN(2)], phaseGrace})
	}
	r.rng.Shuffle(len(plans), func(i, j int) { plans[i], plans[j] = plans[j], plans[i] })

	for i, p := range plans[:crashIterations] {
		r.iterations = i + 1
		if i > 0 && r.rng.IntN(3) != 0 {
			r.mutate(i)
		}
		if p.early != "" {
			run := r.start(fmt.Sprintf("iteration %d, early run", i))
			r.killEarly(run, p.early)
			if r.rng.IntN(3) == 0 {
				r.mutate(i)
			}
		}
		run := r.start(fmt.Sprintf("iteration %d, verified run", i))
		r.waitConverged(run)
		r.waitCheckpointCovers(run)
		r.killLate(run, p.late)
	}

	// A last run: converged, released, then a clean stop. The map is the
	// policy set, and the checkpoint names exactly its identities.
	run := r.start("final run")
	r.waitConverged(run)
	r.waitSettled(run)
	require.NoError(t, run.cmd.Process.Signal(syscall.SIGTERM))
	<-run.exited
	require.NoError(t, run.exitErr, "clean stop: %s", run.logTail())
	final := r.finishRun(run, time.Now())
	require.Equal(t, sortedKeys(run.wanted), sortedKeys(final), "the map after the release is the policy set")
	checkpoint, err := identitycell.ReadCheckpoint(r.checkpointPath())
	require.NoError(t, err)
	require.Equal(t, len(final), checkpoint.Len(), "the checkpoint after a clean stop holds exactly the map's identities")
	for prefix, id := range final {
		lbls, _ := checkpoint.Labels(identity.Number(id))
		require.True(t, lbls.Has(labels.CIDRLabel(prefix)), "checkpoint: identity %d of %s has labels %q", id, prefix, lbls)
	}
	r.stopCheckpointReader()
	r.failOnViolations(run)
	_, err = os.Stat(r.checkpointPath() + ".corrupt")
	require.ErrorIs(t, err, fs.ErrNotExist, "no agent found a corrupt checkpoint")
}

// crashRig is what outlives each agent run: the bpffs mount, the state and
// policy directories, the policy set and the map the last run left.
type crashRig struct {
	t                            *testing.T
	seed                         uint64
	rng                          *rand.Rand
	gen                          *policyGen
	bpfRoot, stateDir, policyDir string
	netns                        string // the agents' network namespace

	inForce   map[string]*crashPolicy // by name
	removed   []*crashPolicy          // may come back
	mutations int

	pinned  map[netip.Prefix]uint32 // the map as the last run left it
	mapID   ebpf.MapID              // the pinned map is never replaced
	current atomic.Pointer[crashRun]

	iterations, runs int
	killed, planned  map[string]int
	releasedUnwanted int
	restoreAfter     time.Duration // from start to the restore log line, last seen
	convergeAfter    time.Duration // from the restore to convergence, last seen

	walks, walkErrors, walkMisses    atomic.Int64
	checked, lookups                 atomic.Int64
	checkpointLooks, checkpointReads atomic.Int64
	sampleTime                       atomic.Int64 // ns spent sampling
	stopReader, readerDone           chan struct{}

	mu         sync.Mutex
	violations []string
}

func newCrashRig(t *testing.T, seed uint64) *crashRig {
	r := &crashRig{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		bpfRoot: filepath.Join(t.TempDir(), "bpf"), stateDir: t.TempDir(), policyDir: t.TempDir(),
		inForce: map[string]*crashPolicy{}, pinned: map[netip.Prefix]uint32{},
		killed: map[string]int{}, planned: map[string]int{},
		restoreAfter: time.Second, convergeAfter: 500 * time.Millisecond,
		stopReader: make(chan struct{}), readerDone: make(chan struct{}),
	}
	r.gen = newPolicyGen(r.rng)
	r.netns = fmt.Sprintf("ipca-crash-%d", os.Getpid())
	out, err := exec.Command("ip", "netns", "add", r.netns).CombinedOutput()
	require.NoError(t, err, "ip netns add %s: %s", r.netns, out)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", r.netns).Run() })
	require.NoError(t, privileged.MountBPFFS(t, r.bpfRoot))
	t.Cleanup(func() {
		if run := r.current.Load(); run != nil {
			run.cmd.Process.Kill()
			<-run.exited
			run.stopSampler()
		}
		r.stopCheckpointReader()
		unix.Unmount(r.bpfRoot, unix.MNT_DETACH)
	})
	for range crashPolicyFiles {
		r.write(r.gen.policy())
	}
	go r.readCheckpoints()
	return r
}

func (r *crashRig) checkpointPath() string {
	return filepath.Join(r.stateDir, identitycell.CheckpointFileName)
}

func (r *crashRig) write(p *crashPolicy) {
	r.t.Helper()
	r.inForce[p.name] = p
	require.NoError(r.t, os.WriteFile(filepath.Join(r.policyDir, p.name+".yaml"), []byte(p.yaml()), 0o600))
}

func (r *crashRig) remove(p *crashPolicy) {
	r.t.Helper()
	delete(r.inForce, p.name)
	require.NoError(r.t, os.Remove(filepath.Join(r.policyDir, p.name+".yaml")))
}

// wanted is every prefix of the policy set: CIDRs and except prefixes.
func (r *crashRig) wanted() map[netip.Prefix]bool {
	out := map[netip.Prefix]bool{}
	for _, p := range r.inForce {
		for _, prefix := range p.prefixes() {
			out[prefix] = true
		}
	}
	return out
}

// mutate changes the policy set while no agent runs: files removed, files
// removed earlier put back, new files, files edited.
func (r *crashRig) mutate(iteration int) {
	r.mutations++
	before := r.wanted()
	names := slices.Sorted(maps.Keys(r.inForce))
	r.rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	removeN, backN, addN, editN := 10+r.rng.IntN(30), r.rng.IntN(10), 10+r.rng.IntN(30), r.rng.IntN(10)
	backN = min(backN, len(r.removed))
	var back []*crashPolicy
	for range backN {
		k := r.rng.IntN(len(r.removed))
		back = append(back, r.removed[k])
		r.removed = slices.Delete(r.removed, k, k+1)
	}
	for _, name := range names[:removeN] {
		r.removed = append(r.removed, r.inForce[name])
		r.remove(r.inForce[name])
	}
	for _, p := range back {
		r.write(p)
	}
	for range addN {
		r.write(r.gen.policy())
	}
	for _, name := range names[removeN : removeN+editN] {
		r.write(r.gen.edit(r.inForce[name]))
	}
	after := r.wanted()
	gone, added := 0, 0
	for prefix := range before {
		if !after[prefix] {
			gone++
		}
	}
	for prefix := range after {
		if !before[prefix] {
			added++
		}
	}
	r.t.Logf("iteration %d: policy set changed: %d files removed, %d put back, %d added, %d edited: "+
		"%d prefixes no longer wanted, %d new, %d wanted", iteration, removeN, backN, addN, editN, gone, added, len(after))
}

// previousEntry is an entry the previous run left, ready to look up.
type previousEntry struct {
	prefix netip.Prefix
	key    bpfmaps.IPCacheKey
	id     uint32
	wanted bool
}

// crashRun is one agent process.
type crashRun struct {
	r      *crashRig
	label  string
	cmd    *exec.Cmd
	log    syncbuf.Buffer
	start  time.Time
	prev   map[netip.Prefix]uint32 // the map it starts from: what it restores
	wanted map[netip.Prefix]bool   // the policy set it reads
	expect map[netip.Prefix]bool   // converged, before the release: wanted and prev

	exited  chan struct{}
	exitErr error

	stop, done         chan struct{}
	converged, settled chan struct{} // closed by the sampler
	convergedAt        atomic.Pointer[time.Time]
	seen               map[netip.Prefix]uint32 // numbers of new prefixes (sampler only)
	reported           map[netip.Prefix]bool   // violations are reported once per prefix (sampler only)
	last               atomic.Pointer[map[netip.Prefix]uint32]
	settledWalks       int
	convergedOnce      sync.Once
	settledOnce        sync.Once
	samplerStopOnce    sync.Once
	pinnedMap          *ebpf.Map // sampler only
	openFailed         bool
	prevKeys           []previousEntry
}

func (r *crashRig) start(label string) *crashRun {
	r.t.Helper()
	r.runs++
	run := &crashRun{
		r: r, label: label, prev: r.pinned, wanted: r.wanted(), expect: map[netip.Prefix]bool{},
		exited: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
		converged: make(chan struct{}), settled: make(chan struct{}),
		seen: map[netip.Prefix]uint32{}, reported: map[netip.Prefix]bool{},
	}
	for prefix := range run.wanted {
		run.expect[prefix] = true
	}
	for prefix, id := range run.prev {
		run.expect[prefix] = true
		run.prevKeys = append(run.prevKeys, previousEntry{
			prefix: prefix, key: bpfmaps.NewIPCacheKey(prefix), id: id, wanted: run.wanted[prefix]})
	}
	run.cmd = agentCommand("--bpf-root="+r.bpfRoot, "--state-dir="+r.stateDir, "--policy-dir="+r.policyDir,
		"--identity-restore-grace-period="+crashGrace.String(), "--log-format=json",
		"--shell-sock-path="+filepath.Join(r.stateDir, "shell.sock"))
	// In the rig's network namespace, which has no address: the host
	// entity's addresses (every address of the agent's namespace) would
	// be prefixes neither wanted nor restored. nsenter execs the agent,
	// so the process killed is the agent.
	run.cmd.Args = append([]string{"nsenter", "--net=/run/netns/" + r.netns, "--"}, run.cmd.Args...)
	run.cmd.Path, run.cmd.Err = exec.LookPath("nsenter")
	run.cmd.Stdout, run.cmd.Stderr = &run.log, &run.log
	run.start = time.Now()
	require.NoError(r.t, run.cmd.Start())
	r.current.Store(run)
	go func() {
		run.exitErr = run.cmd.Wait()
		close(run.exited)
	}()
	go run.sample()
	return run
}

// sleepUntil sleeps until deadline; false if the agent exited meanwhile.
func (run *crashRun) sleepUntil(deadline time.Time) bool {
	select {
	case <-run.exited:
		return false
	case <-time.After(time.Until(deadline)):
		return true
	}
}

func (run *crashRun) exitedEarly() {
	run.r.t.Helper()
	run.stopSampler()
	run.r.t.Fatalf("seed %d, %s: the agent exited by itself: %v\n%s", run.r.seed, run.label, run.exitErr, run.logTail())
}

// waitRestored waits for the restore log line and returns its time.
func (run *crashRun) waitRestored() time.Time {
	run.r.t.Helper()
	deadline := time.Now().Add(crashWait)
	for time.Now().Before(deadline) {
		if at := run.event(msgRestored); !at.IsZero() {
			return at
		}
		if !run.sleepUntil(time.Now().Add(5 * time.Millisecond)) {
			run.exitedEarly()
		}
	}
	run.r.t.Fatalf("seed %d, %s: no restore within %s\n%s", run.r.seed, run.label, crashWait, run.logTail())
	return time.Time{}
}

func (r *crashRig) killEarly(run *crashRun, phase string) {
	r.t.Helper()
	r.planned[phase]++
	var at time.Time
	switch phase {
	case phaseRestore:
		at = run.start.Add(randDuration(r.rng, r.restoreAfter))
	case phaseConvergence:
		at = run.waitRestored().Add(randDuration(r.rng, r.convergeAfter))
	}
	if !run.sleepUntil(at) {
		run.exitedEarly()
	}
	r.kill(run)
}

func (r *crashRig) killLate(run *crashRun, phase string) {
	r.t.Helper()
	r.planned[phase]++
	releaseAt := run.waitRestored().Add(crashGrace)
	var at time.Time
	switch phase {
	case phaseGrace:
		at = time.Now().Add(randDuration(r.rng, time.Until(releaseAt.Add(-releaseWindow))))
	case phaseRelease:
		at = releaseAt.Add(randDuration(r.rng, 2*releaseWindow) - releaseWindow)
	case phaseAfterRelease:
		r.waitSettled(run)
		at = time.Now().Add(randDuration(r.rng, releaseWindow))
	}
	if !run.sleepUntil(at) {
		run.exitedEarly()
	}
	r.kill(run)
}

// kill SIGKILLs the agent, checks the map it left and keeps it for the
// next run.
func (r *crashRig) kill(run *crashRun) {
	r.t.Helper()
	killedAt := time.Now()
	select {
	case <-run.exited:
		run.exitedEarly()
	default:
	}
	require.NoError(r.t, run.cmd.Process.Signal(syscall.SIGKILL))
	<-run.exited
	phase := run.phaseAt(killedAt)
	r.killed[phase]++
	r.t.Logf("%s: killed at %s after start, phase %s", run.label, killedAt.Sub(run.start).Round(time.Millisecond), phase)
	r.finishRun(run, time.Now())
}

// finishRun checks the map a stopped agent left, exactly (nothing writes
// to it now), and keeps it as what the next run restores. stoppedAt is
// when the agent was seen gone: the last moment it could write.
func (r *crashRig) finishRun(run *crashRun, stoppedAt time.Time) map[netip.Prefix]uint32 {
	r.t.Helper()
	run.stopSampler()
	if at := run.event(msgRestored); !at.IsZero() {
		// Estimates for the next early kill, bounded: one slow run on a
		// loaded machine should not push the next kill out of its phase.
		r.restoreAfter = min(at.Sub(run.start), 3*time.Second)
		if converged := run.convergedAt.Load(); converged != nil {
			r.convergeAfter = min(max(converged.Sub(at), 10*time.Millisecond), 3*time.Second)
			r.t.Logf("%s: restored %s after start, converged %s after the restore", run.label,
				at.Sub(run.start).Round(time.Millisecond), converged.Sub(at).Round(time.Millisecond))
		}
	}
	if strings.Contains(run.log.String(), "Identity checkpoint is corrupt") {
		run.violation(stoppedAt, "the agent found a corrupt identity checkpoint")
	}
	left := map[netip.Prefix]uint32{}
	if _, err := os.Stat(filepath.Join(r.bpfRoot, "ipcache-agent", bpfmaps.IPCacheName)); err == nil {
		pinned, err := bpfmaps.ReadIPCache(r.bpfRoot)
		require.NoError(r.t, err)
		for prefix, id := range pinned {
			left[prefix] = uint32(id)
		}
	}
	withinGrace := stoppedAt.Before(run.start.Add(crashGrace))
	convergedAt := run.convergedAt.Load()
	settled := isClosed(run.settled)
	owner := map[uint32]netip.Prefix{}
	for prefix, id := range left {
		if !identity.Number(id).IsLocal() {
			run.violation(stoppedAt, "left %s with identity %d, not a local identity", prefix, id)
		}
		if other, dup := owner[id]; dup {
			run.violation(stoppedAt, "left %s and %s with the same identity %d", prefix, other, id)
		}
		owner[id] = prefix
		old, restored := run.prev[prefix]
		switch {
		case restored && old != id:
			run.violation(stoppedAt, "left %s with identity %d; it had %d before this run", prefix, id, old)
		case !restored && !run.wanted[prefix]:
			run.violation(stoppedAt, "left %s (identity %d), neither wanted nor restored", prefix, id)
		case !restored && run.seen[prefix] != 0 && run.seen[prefix] != id:
			run.violation(stoppedAt, "left new prefix %s with identity %d; it was seen with %d", prefix, id, run.seen[prefix])
		}
	}
	for prefix, id := range run.prev {
		if _, ok := left[prefix]; !ok {
			switch {
			case run.wanted[prefix]:
				run.violation(stoppedAt, "wanted prefix %s (identity %d) missing after the stop", prefix, id)
			case withinGrace:
				run.violation(stoppedAt, "restored prefix %s (identity %d) removed within the grace period", prefix, id)
			default:
				r.releasedUnwanted++
			}
		}
	}
	if convergedAt != nil && convergedAt.Before(stoppedAt) {
		for prefix := range run.wanted {
			if _, ok := left[prefix]; !ok {
				run.violation(stoppedAt, "wanted prefix %s missing after the stop, though the map had converged", prefix)
			}
		}
	}
	if settled && !slices.Equal(sortedKeys(left), sortedKeys(run.wanted)) {
		run.violation(stoppedAt, "the map had become the policy set, and is not after the stop: %s",
			diffKeys(left, run.wanted))
	}
	r.failOnViolations(run)

	info, err := ebpfMapInfo(r.bpfRoot)
	if err == nil {
		if r.mapID != 0 && info != r.mapID {
			r.t.Fatalf("seed %d, %s: the pinned ipcache map was replaced (id %d, was %d)", r.seed, run.label, info, r.mapID)
		}
		r.mapID = info
	}
	r.pinned = left
	return left
}

func ebpfMapInfo(bpfRoot string) (ebpf.MapID, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, "ipcache-agent", bpfmaps.IPCacheName),
		&ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return 0, err
	}
	id, _ := info.ID()
	return id, nil
}

// waitConverged waits until the map is the policy set plus what was
// restored (or, if the release came first, the policy set).
func (r *crashRig) waitConverged(run *crashRun) {
	r.t.Helper()
	select {
	case <-run.converged:
	case <-run.settled:
	case <-run.exited:
		run.exitedEarly()
	case <-time.After(crashWait):
		run.stopSampler()
		r.t.Fatalf("seed %d, %s: the map did not converge within %s: against the policy set and the restored prefixes: %s\n%s",
			r.seed, run.label, crashWait, diffKeys(*run.last.Load(), run.expect), run.logTail())
	}
}

// waitSettled waits until the grace period has released the restored
// prefixes and the map is the policy set.
func (r *crashRig) waitSettled(run *crashRun) {
	r.t.Helper()
	select {
	case <-run.settled:
	case <-run.exited:
		run.exitedEarly()
	case <-time.After(crashWait):
		run.stopSampler()
		r.t.Fatalf("seed %d, %s: the map did not become the policy set within %s: %s\n%s",
			r.seed, run.label, crashWait, diffKeys(*run.last.Load(), run.wanted), run.logTail())
	}
}

// waitCheckpointCovers waits until the checkpoint names every identity of
// the converged map with its prefix.
func (r *crashRig) waitCheckpointCovers(run *crashRun) {
	r.t.Helper()
	deadline := time.Now().Add(crashWait)
	var missing []string
	for time.Now().Before(deadline) {
		checkpoint, err := identitycell.ReadCheckpoint(r.checkpointPath())
		require.NoError(r.t, err)
		missing = missing[:0]
		for prefix, id := range *run.last.Load() {
			if lbls, _ := checkpoint.Labels(identity.Number(id)); !lbls.Has(labels.CIDRLabel(prefix)) {
				missing = append(missing, fmt.Sprintf("%s=%d", prefix, id))
			}
		}
		if len(missing) == 0 {
			return
		}
		if !run.sleepUntil(time.Now().Add(20 * time.Millisecond)) {
			run.exitedEarly()
		}
	}
	slices.Sort(missing)
	r.t.Fatalf("seed %d, %s: the checkpoint lacks %d identities of the map, e.g. %v", r.seed, run.label, len(missing), missing[:min(10, len(missing))])
}

// sample runs while the agent does (and a little after), checking every
// map state it sees.
func (run *crashRun) sample() {
	defer close(run.done)
	defer func() {
		if run.pinnedMap != nil {
			run.pinnedMap.Close()
		}
	}()
	empty := map[netip.Prefix]uint32{}
	run.last.Store(&empty)
	graceEnd := run.start.Add(crashGrace)
	for {
		select {
		case <-run.stop:
			return
		default:
		}
		log := run.log.String()
		initialized := strings.Contains(log, msgInitialized)
		released := strings.Contains(log, msgReleased)
		at := time.Now()
		if run.pinnedMap == nil && !run.openPinnedMap(at) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		walk, err := walkIPCache(run.pinnedMap)
		if err != nil {
			run.r.walkErrors.Add(1)
			time.Sleep(5 * time.Millisecond)
			continue
		}
		run.r.walks.Add(1)
		run.last.Store(&walk)
		run.checkPrevious(at, walk, graceEnd)
		run.checkWalk(at, walk, initialized, released)
		run.r.sampleTime.Add(int64(time.Since(at)))
		time.Sleep(10 * time.Millisecond) // leave the agent some CPU
	}
}

// openPinnedMap opens the pinned ipcache map, once the first run made it.
func (run *crashRun) openPinnedMap(at time.Time) bool {
	m, err := ebpf.LoadPinnedMap(filepath.Join(run.r.bpfRoot, "ipcache-agent", bpfmaps.IPCacheName),
		&ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		if len(run.prev) > 0 && !run.openFailed {
			run.violation(at, "cannot open the pinned ipcache map the previous run left: %v", err)
			run.openFailed = true
		}
		return false
	}
	run.pinnedMap = m
	return true
}

// walkIPCache reads the whole map: prefix -> identity. It reads in
// batches (a few system calls instead of two per entry) where the kernel
// can.
func walkIPCache(m *ebpf.Map) (map[netip.Prefix]uint32, error) {
	out := map[netip.Prefix]uint32{}
	keys := make([]bpfmaps.IPCacheKey, 4096)
	values := make([]bpfmaps.IPCacheValue, len(keys))
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		for i := range n {
			if prefix, err := keys[i].Prefix(); err == nil {
				out[prefix] = uint32(values[i].Identity())
			}
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			clear(out)
			var (
				key   bpfmaps.IPCacheKey
				value bpfmaps.IPCacheValue
			)
			it := m.Iterate()
			for it.Next(&key, &value) {
				if prefix, err := key.Prefix(); err == nil {
					out[prefix] = uint32(value.Identity())
				}
			}
			return out, it.Err()
		case err != nil:
			return nil, err
		}
	}
}

// checkPrevious checks every prefix the previous run left: one still
// wanted has its number always; one not wanted any more has it until the
// grace period can have ended. What the walk does not show is looked up
// on its own before it counts: a walk of an LPM trie being written can
// miss an entry or, for one deleted under it, show the value of a
// shorter prefix. (An LPM lookup of a prefix that is absent finds a
// shorter one, with another number: that is caught too.)
func (run *crashRun) checkPrevious(at time.Time, walk map[netip.Prefix]uint32, graceEnd time.Time) {
	var missing []string
	var value bpfmaps.IPCacheValue
	for i := range run.prevKeys {
		prev := &run.prevKeys[i]
		if !prev.wanted && !at.Before(graceEnd) {
			continue
		}
		run.r.checked.Add(1)
		if id, ok := walk[prev.prefix]; ok && id == prev.id {
			continue
		}
		if !prev.wanted && !time.Now().Before(graceEnd) {
			continue // the grace period may have ended during the walk
		}
		run.r.lookups.Add(1)
		err := run.pinnedMap.Lookup(&prev.key, &value)
		var problem string
		switch {
		case err == nil && uint32(value.Identity()) == prev.id:
			run.r.walkMisses.Add(1)
			continue
		case errors.Is(err, ebpf.ErrKeyNotExist):
			problem = "absent"
		case err != nil:
			problem = fmt.Sprintf("lookup: %v", err)
		default:
			problem = fmt.Sprintf("lookup finds identity %d (changed, or absent under a shorter prefix)", value.Identity())
		}
		if !run.reported[prev.prefix] { // once per prefix and run
			run.reported[prev.prefix] = true
			missing = append(missing, fmt.Sprintf("%s (identity %d, wanted %t): %s", prev.prefix, prev.id, prev.wanted, problem))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		run.violation(at, "%d prefixes of the previous run not in the map (wanted before and after, or restored within the grace period): %s",
			len(missing), strings.Join(missing[:min(10, len(missing))], "; "))
	}
}

// checkWalk checks one walk of the map. Walks can miss entries being
// written, so they only check what they found, and convergence.
func (run *crashRun) checkWalk(at time.Time, walk map[netip.Prefix]uint32, initialized, released bool) {
	var strays, renumbered []string
	for prefix, id := range walk {
		if _, restored := run.prev[prefix]; restored {
			continue // checked by lookups
		}
		if !run.wanted[prefix] {
			if !run.reported[prefix] {
				run.reported[prefix] = true
				strays = append(strays, fmt.Sprintf("%s=%d", prefix, id))
			}
			continue
		}
		if old, ok := run.seen[prefix]; ok && old != id && !run.reported[prefix] {
			run.reported[prefix] = true
			renumbered = append(renumbered, fmt.Sprintf("%s: %d then %d", prefix, old, id))
		}
		run.seen[prefix] = id
	}
	if len(strays) > 0 {
		slices.Sort(strays)
		run.violation(at, "%d prefixes in the map neither wanted nor restored: %v", len(strays), strays[:min(10, len(strays))])
	}
	if len(renumbered) > 0 {
		slices.Sort(renumbered)
		run.violation(at, "%d new prefixes changed number: %v", len(renumbered), renumbered[:min(10, len(renumbered))])
	}
	// Converged: the agent has initialized its ipcache table, has not yet
	// released the restored prefixes, and the map is the policy set and
	// what was restored.
	if initialized && !released && len(walk) == len(run.expect) && containsAll(walk, run.expect) {
		run.convergedOnce.Do(func() {
			run.convergedAt.Store(&at)
			close(run.converged)
		})
	}
	// Settled: twice in a row after the release, the map is the policy set.
	if initialized && released && len(walk) == len(run.wanted) && containsAll(walk, run.wanted) {
		run.settledWalks++
		if run.settledWalks >= 2 {
			run.settledOnce.Do(func() {
				run.convergedOnce.Do(func() {
					run.convergedAt.Store(&at)
					close(run.converged)
				})
				close(run.settled)
			})
		}
	} else {
		run.settledWalks = 0
	}
}

func (run *crashRun) stopSampler() {
	run.samplerStopOnce.Do(func() {
		close(run.stop)
		<-run.done
	})
}

// readCheckpoints reads the checkpoint in a loop for the whole test:
// whenever it exists it must parse; a reader never sees a part of it. The
// file is looked at every millisecond and read whenever it changed (inode,
// size or modification time: an atomic replacement is a new inode, a write
// in place changes the others); what was read is parsed by the agent's own
// reader, from a copy, so that what is parsed is what was read.
func (r *crashRig) readCheckpoints() {
	defer close(r.readerDone)
	copyPath := filepath.Join(r.t.TempDir(), identitycell.CheckpointFileName)
	type version struct {
		inode, size uint64
		modified    int64
	}
	var last version
	for {
		select {
		case <-r.stopReader:
			return
		default:
		}
		time.Sleep(time.Millisecond)
		var st unix.Stat_t
		if err := unix.Stat(r.checkpointPath(), &st); err != nil {
			continue
		}
		r.checkpointLooks.Add(1)
		current := version{st.Ino, uint64(st.Size), st.Mtim.Nano()}
		if current == last {
			continue
		}
		last = current
		data, err := os.ReadFile(r.checkpointPath())
		if err != nil {
			continue // replaced between stat and read
		}
		r.checkpointReads.Add(1)
		if err := os.WriteFile(copyPath, data, 0o600); err != nil {
			r.addViolation(fmt.Sprintf("copy checkpoint: %v", err))
			continue
		}
		if _, err := identitycell.ReadCheckpoint(copyPath); err != nil {
			if run := r.current.Load(); run != nil {
				run.violation(time.Now(), "checkpoint does not parse (%d bytes): %v", len(data), err)
			} else {
				r.addViolation(fmt.Sprintf("checkpoint does not parse (%d bytes): %v", len(data), err))
			}
		}
	}
}

func (r *crashRig) stopCheckpointReader() {
	select {
	case <-r.stopReader:
	default:
		close(r.stopReader)
	}
	<-r.readerDone
}

func (r *crashRig) addViolation(v string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, v)
}

func (run *crashRun) violation(at time.Time, format string, args ...any) {
	run.r.addViolation(fmt.Sprintf("%s, phase %s, %s after start: %s", run.label, run.phaseAt(at),
		at.Sub(run.start).Round(time.Millisecond), fmt.Sprintf(format, args...)))
}

func (r *crashRig) failOnViolations(run *crashRun) {
	r.t.Helper()
	r.mu.Lock()
	violations := slices.Clone(r.violations)
	r.mu.Unlock()
	if len(violations) == 0 {
		return
	}
	const show = 20
	more := ""
	if len(violations) > show {
		more = fmt.Sprintf("\n... and %d more", len(violations)-show)
	}
	// Say so when the restored prefixes were released before every owner
	// had spoken: what the release took away was still wanted.
	note := ""
	if released, initialized := run.event(msgReleased), run.event(msgInitialized); !released.IsZero() &&
		(initialized.IsZero() || released.Before(initialized)) {
		note = fmt.Sprintf("\nnote: %s released the restored prefixes %s after start, before its ipcache table was initialized (%s)",
			run.label, released.Sub(run.start).Round(time.Millisecond), initializedAt(run, initialized))
	}
	r.t.Fatalf("seed %d (replay with %s=%d): %d violations:\n%s%s%s\nagent log of %s:\n%s",
		r.seed, crashSeedEnv, r.seed, len(violations), strings.Join(violations[:min(show, len(violations))], "\n"), more,
		note, run.label, run.logTail())
}

func initializedAt(run *crashRun, initialized time.Time) string {
	if initialized.IsZero() {
		return "not initialized"
	}
	return fmt.Sprintf("%s after start", initialized.Sub(run.start).Round(time.Millisecond))
}

// phaseAt names the phase of the run at a moment, from the agent's log
// and what the sampler saw.
func (run *crashRun) phaseAt(at time.Time) string {
	restored := run.event(msgRestored)
	released := run.event(msgReleased)
	convergedAt := run.convergedAt.Load()
	switch {
	case restored.IsZero() || at.Before(restored):
		return phaseRestore
	case !released.IsZero() && at.After(released.Add(releaseWindow)):
		return phaseAfterRelease
	case !released.IsZero() && at.After(released.Add(-releaseWindow)),
		released.IsZero() && at.After(restored.Add(crashGrace-releaseWindow)):
		return phaseRelease
	case convergedAt == nil || at.Before(*convergedAt):
		return phaseConvergence
	}
	return phaseGrace
}

// event returns the time of the agent's first log line with msg, or zero.
func (run *crashRun) event(msg string) time.Time {
	for line := range strings.Lines(run.log.String()) {
		if !strings.Contains(line, msg) {
			continue
		}
		var record struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &record) == nil && strings.HasPrefix(record.Msg, msg) {
			return record.Time
		}
	}
	return time.Time{}
}

// logTail is the agent's log without the line per policy file.
func (run *crashRun) logTail() string {
	var lines []string
	for line := range strings.Lines(run.log.String()) {
		if !strings.Contains(line, "Policy file in force") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines[max(0, len(lines)-60):], "")
}

// crashPolicy is one generated policy file.
type crashPolicy struct {
	name            string
	egress, ingress []netip.Prefix
	set, except     netip.Prefix // a toCIDRSet rule, if set is valid
	port            bool
}

func (p *crashPolicy) prefixes() []netip.Prefix {
	out := append(slices.Clone(p.egress), p.ingress...)
	if p.set.IsValid() {
		out = append(out, p.set, p.except)
	}
	return out
}

func (p *crashPolicy) yaml() string {
	quoted := func(prefixes []netip.Prefix) string {
		var s []string
		for _, prefix := range prefixes {
			s = append(s, strconv.Quote(prefix.String()))
		}
		return strings.Join(s, ", ")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\negress:\n  - toCIDR: [%s]\n", p.name, quoted(p.egress))
	if p.port {
		b.WriteString("    toPorts: [{port: 443, protocol: TCP}]\n")
	}
	if p.set.IsValid() {
		fmt.Fprintf(&b, "  - toCIDRSet:\n      - cidr: %s\n        except: [%q]\n", p.set, p.except.String())
	}
	fmt.Fprintf(&b, "ingress:\n  - fromCIDR: [%s]\n", quoted(p.ingress))
	return b.String()
}

// policyGen makes policies of mostly distinct prefixes (IPv4 /32 and /24,
// IPv6 /64 and /128), some shared between policies.
type policyGen struct {
	rng    *rand.Rand
	shared []netip.Prefix
	n      int
}

func newPolicyGen(rng *rand.Rand) *policyGen {
	g := &policyGen{rng: rng}
	for range 60 {
		g.shared = append(g.shared, g.prefix())
	}
	return g
}

func (g *policyGen) prefix() netip.Prefix {
	r := g.rng
	b := func(n int) byte { return byte(r.IntN(n)) }
	switch r.IntN(4) {
	case 0:
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, b(128), b(256), b(256)}), 32)
	case 1:
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 + b(128), b(256), 0}), 24)
	case 2:
		return netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, b(256), b(256)}), 64)
	default:
		return netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 2, b(256), b(256), 14: b(256), 15: b(256)}), 128)
	}
}

func (g *policyGen) distinct(n int, have ...netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for len(out) < n {
		if p := g.prefix(); !slices.Contains(out, p) && !slices.Contains(have, p) {
			out = append(out, p)
		}
	}
	return out
}

func (g *policyGen) policy() *crashPolicy {
	g.n++
	p := &crashPolicy{name: fmt.Sprintf("crash-%04d", g.n), port: g.n%10 == 0}
	p.egress = g.distinct(6)
	p.ingress = g.distinct(3)
	if shared := g.shared[g.rng.IntN(len(g.shared))]; g.rng.IntN(2) == 0 && !slices.Contains(p.ingress, shared) {
		p.ingress = append(p.ingress, shared)
	}
	if g.n%8 == 0 {
		k := g.n / 8
		p.set = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + k/256%16), byte(k % 256), 0}), 24)
		p.except = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + k/256%16), byte(k % 256), 16}), 28)
	}
	return p
}

// edit replaces two of a policy's egress CIDRs.
func (g *policyGen) edit(p *crashPolicy) *crashPolicy {
	edited := *p
	edited.egress = append(slices.Clone(p.egress[2:]), g.distinct(2, p.egress...)...)
	return &edited
}

func randDuration(rng *rand.Rand, upTo time.Duration) time.Duration {
	if upTo <= 0 {
		return 0
	}
	return time.Duration(rng.Int64N(int64(upTo)))
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func containsAll[V any](m map[netip.Prefix]V, want map[netip.Prefix]bool) bool {
	for prefix := range want {
		if _, ok := m[prefix]; !ok {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[netip.Prefix]V) []netip.Prefix {
	return slices.SortedFunc(maps.Keys(m), prefixkey.Compare)
}

// diffKeys says which prefixes the map lacks and which it has too many.
func diffKeys[V any](got map[netip.Prefix]V, want map[netip.Prefix]bool) string {
	var missing, extra []netip.Prefix
	for prefix := range want {
		if _, ok := got[prefix]; !ok {
			missing = append(missing, prefix)
		}
	}
	for prefix := range got {
		if !want[prefix] {
			extra = append(extra, prefix)
		}
	}
	slices.SortFunc(missing, prefixkey.Compare)
	slices.SortFunc(extra, prefixkey.Compare)
	return fmt.Sprintf("%d entries, want %d; %d missing %v; %d extra %v", len(got), len(want),
		len(missing), missing[:min(10, len(missing))], len(extra), extra[:min(10, len(extra))])
}
