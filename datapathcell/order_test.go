// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// recordingMaps are fakes of the ipcache, policy and enforcement maps that
// share one lock, so that they see the writes of the three writers in one
// order, as the kernel does. After every single key written (a batch is
// written key by key, as the kernel does) they check that each watched
// address is allowed in its direction, as the enforcement program would
// decide from the three maps at that moment.
type recordingMaps struct {
	t  testing.TB
	mu sync.Mutex

	ipcache     map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue
	policy      map[bpfmaps.PolicyKey]bpfmaps.PolicyValue
	policyMax   int
	enforcement [2]uint32

	// watched must stay allowed in their direction; violations are what
	// the check found, with the write that made it.
	watched    map[netip.Addr]uint8
	violations []string
	writes     int
	// check, if set, replaces the check of the watched addresses (the
	// endpoints' maps: endpoint_order_test.go).
	check func() []string
}

func newRecordingMaps(t testing.TB, policyMax int) *recordingMaps {
	return &recordingMaps{
		t: t, ipcache: map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue{}, policy: map[bpfmaps.PolicyKey]bpfmaps.PolicyValue{}, policyMax: policyMax,
		watched: map[netip.Addr]uint8{},
	}
}

func (r *recordingMaps) maps() *writtenMaps {
	return &writtenMaps{
		ipcache:     &fakeMap[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]{r: r, entries: r.ipcache},
		policy:      &fakeMap[bpfmaps.PolicyKey, bpfmaps.PolicyValue]{r: r, entries: r.policy, max: func() int { return r.policyMax }},
		enforcement: &fakeEnforcement{r: r},
	}
}

// watch makes addr one that must stay allowed in direction from now on.
func (r *recordingMaps) watch(addr string, direction uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watched[netip.MustParseAddr(addr)] = direction
}

// identityOf is the ipcache map's answer for addr: the identity of the
// longest prefix that holds it, or world.
func (r *recordingMaps) identityOf(addr netip.Addr) uint32 {
	bits := 32
	if addr.Is6() {
		bits = 128
	}
	for ; bits >= 0; bits-- {
		p, _ := addr.Prefix(bits)
		if v, ok := r.ipcache[bpfmaps.NewIPCacheKey(p)]; ok {
			return uint32(v.Identity())
		}
	}
	return uint32(identity.World)
}

// allowed is the program's verdict for any protocol and port.
func (r *recordingMaps) allowed(addr netip.Addr, direction uint8) bool {
	if r.enforcement[direction] == 0 {
		return true
	}
	for _, id := range []uint32{r.identityOf(addr), 0} {
		if v, ok := r.policy[policyMapKey(id, direction, 0, 0)]; ok && v.Verdict() == uint32(policy.VerdictAllow) {
			return true
		}
	}
	return false
}

// wrote checks the watched addresses after one key was written; r.mu held.
func (r *recordingMaps) wrote(what string) {
	r.writes++
	if r.check != nil {
		for _, v := range r.check() {
			r.violations = append(r.violations, fmt.Sprintf("after write %d (%s): %s", r.writes, what, v))
		}
		return
	}
	for addr, dir := range r.watched {
		if !r.allowed(addr, dir) {
			r.violations = append(r.violations, fmt.Sprintf("after write %d (%s): %s dropped (identity %d, enforcement %v)",
				r.writes, what, addr, r.identityOf(addr), r.enforcement))
		}
	}
}

func (r *recordingMaps) takeViolations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.violations
	r.violations = nil
	return v
}

// fakeMap is a hash map (the LPM semantics are in recordingMaps.identityOf).
type fakeMap[K comparable, V any] struct {
	r       *recordingMaps
	entries map[K]V
	max     func() int
	cursors map[*ebpf.MapBatchCursor][]K
}

func (m *fakeMap[K, V]) MaxEntries() uint32 {
	if m.max == nil {
		return 1 << 20
	}
	return uint32(m.max())
}

func (m *fakeMap[K, V]) putLocked(k K, v V) error {
	if _, ok := m.entries[k]; !ok && m.max != nil && len(m.entries) >= m.max() {
		return unix.E2BIG
	}
	m.entries[k] = v
	m.r.wrote(fmt.Sprintf("put %v", k))
	return nil
}

func (m *fakeMap[K, V]) Put(key, value any) error {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	return m.putLocked(*key.(*K), *value.(*V))
}

func (m *fakeMap[K, V]) Lookup(key, valueOut any) error {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	v, ok := m.entries[*key.(*K)]
	if !ok {
		return ebpf.ErrKeyNotExist
	}
	*valueOut.(*V) = v
	return nil
}

func (m *fakeMap[K, V]) Delete(key any) error {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	return m.deleteLocked(*key.(*K))
}

func (m *fakeMap[K, V]) deleteLocked(k K) error {
	if _, ok := m.entries[k]; !ok {
		return ebpf.ErrKeyNotExist
	}
	delete(m.entries, k)
	m.r.wrote(fmt.Sprintf("delete %v", k))
	return nil
}

func (m *fakeMap[K, V]) BatchUpdate(keys, values any, _ *ebpf.BatchOptions) (int, error) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	ks, vs := keys.([]K), values.([]V)
	for i := range ks {
		if err := m.putLocked(ks[i], vs[i]); err != nil {
			return i, err
		}
	}
	return len(ks), nil
}

func (m *fakeMap[K, V]) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	ks := keys.([]K)
	for i := range ks {
		if err := m.deleteLocked(ks[i]); err != nil {
			return i, err
		}
	}
	return len(ks), nil
}

func (m *fakeMap[K, V]) BatchLookup(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, _ *ebpf.BatchOptions) (int, error) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	if m.cursors == nil {
		m.cursors = map[*ebpf.MapBatchCursor][]K{}
	}
	left, started := m.cursors[cursor]
	if !started {
		for k := range m.entries {
			left = append(left, k)
		}
	}
	ks, vs := keysOut.([]K), valuesOut.([]V)
	n := copy(ks, left)
	for i := range n {
		vs[i] = m.entries[ks[i]]
	}
	m.cursors[cursor] = left[n:]
	if len(left) == n {
		delete(m.cursors, cursor)
		return n, ebpf.ErrKeyNotExist
	}
	return n, nil
}

func (m *fakeMap[K, V]) Iterate() *ebpf.MapIterator { panic("the fake reads in batches") }

// fakeEnforcement is the enforcement array.
type fakeEnforcement struct{ r *recordingMaps }

func (e *fakeEnforcement) Put(key, value any) error {
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	k, v := *key.(*bpfmaps.EnforcementKey), *value.(*bpfmaps.EnforcementValue)
	if k.Subject() != 0 {
		return fmt.Errorf("fake enforcement map: subject %d: only the default's are kept", k.Subject())
	}
	dir := k.Direction()
	e.r.enforcement[dir] = uint32(v)
	e.r.wrote(fmt.Sprintf("enforcement[%d] = %d", dir, v))
	return nil
}

func (e *fakeEnforcement) Lookup(key, valueOut any) error {
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	*valueOut.(*bpfmaps.EnforcementValue) = bpfmaps.EnforcementValue(e.r.enforcement[key.(*bpfmaps.EnforcementKey).Direction()])
	return nil
}

func (e *fakeEnforcement) Delete(any) error { return ebpf.ErrNotSupported }
func (e *fakeEnforcement) BatchUpdate(any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (e *fakeEnforcement) BatchDelete(any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (e *fakeEnforcement) BatchLookup(*ebpf.MapBatchCursor, any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrKeyNotExist // no subject's entries (the default's are looked up)
}
func (e *fakeEnforcement) Iterate() *ebpf.MapIterator { panic("not iterated") }
func (e *fakeEnforcement) MaxEntries() uint32         { return 2 }

// orderFixture is the whole control plane (identities, ipcache, policies
// from a directory, the three map writers) over recording maps.
type orderFixture struct {
	t        *testing.T
	maps     *recordingMaps
	dir      string
	db       *statedb.DB
	ipcache  *ipcachecell.IPCache
	entries  statedb.Table[*ipcachecell.Entry]
	policy   statedb.Table[*policy.Entry]
	enforce  statedb.Table[*policy.Enforcement]
	datapath *Datapath
}

func newOrderFixture(t *testing.T, policyMax int) *orderFixture {
	f := &orderFixture{t: t, maps: newRecordingMaps(t, policyMax), dir: t.TempDir()}
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(cell.NewSimpleHealth),
		cell.Config(statedir.DefaultConfig),
		identitycell.Cell,
		ipcachecell.Cell,
		policycell.Cell,
		Cell,
		cell.Invoke(func(d *Datapath, db *statedb.DB, c *ipcachecell.IPCache, e statedb.Table[*ipcachecell.Entry],
			p statedb.Table[*policy.Entry], en statedb.Table[*policy.Enforcement]) {
			d.fakeMaps = f.maps.maps()
			f.datapath, f.db, f.ipcache, f.entries, f.policy, f.enforce = d, db, c, e, p, en
		}),
	)
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
	hive.AddConfigOverride(h, func(c *policycell.Config) { c.PolicyDir = f.dir })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	return f
}

// writePolicy writes a policy file atomically.
func (f *orderFixture) writePolicy(name, content string) {
	f.t.Helper()
	tmp := filepath.Join(f.dir, ".tmp")
	require.NoError(f.t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(f.t, os.Rename(tmp, filepath.Join(f.dir, name)))
}

func (f *orderFixture) removePolicy(name string) {
	f.t.Helper()
	require.NoError(f.t, os.Remove(filepath.Join(f.dir, name)))
}

// egressPolicy is a policy file allowing egress to cidrs.
func egressPolicy(name string, cidrs ...string) string {
	return fmt.Sprintf("name: %s\negress:\n  - toCIDR: [%s]\n", name, strings.Join(cidrs, ", "))
}

// hosts returns n /32s in 10.250.0.0/16, quoted for a policy file.
func hosts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%q", fmt.Sprintf("10.250.%d.%d/32", i/250, i%250+1))
	}
	return out
}

// converged waits until the change is seen (done holds) and the maps hold
// what the tables say and nothing is left to write: every row Done, no
// key draining, the fakes equal to the tables.
func (f *orderFixture) converged(what string, done func() bool) {
	f.t.Helper()
	why := "change not seen"
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if done() {
			if why = f.unconverged(); why == "" {
				return
			}
		}
	}
	f.t.Fatalf("%s: not converged: %s", what, why)
}

// has returns a condition: the ipcache map holds exactly prefixes.
func (f *orderFixture) has(prefixes ...string) func() bool {
	return func() bool {
		f.maps.mu.Lock()
		defer f.maps.mu.Unlock()
		for _, p := range prefixes {
			if _, ok := f.maps.ipcache[bpfmaps.NewIPCacheKey(netip.MustParsePrefix(p))]; !ok {
				return false
			}
		}
		return len(f.maps.ipcache) == len(prefixes)
	}
}

// size returns a condition: the ipcache map holds n entries.
func (f *orderFixture) size(n int) func() bool {
	return func() bool {
		f.maps.mu.Lock()
		defer f.maps.mu.Unlock()
		return len(f.maps.ipcache) == n
	}
}

// enforced returns a condition: the direction is (or is not) enforced.
func (f *orderFixture) enforced(dir policy.Direction, on bool) func() bool {
	return func() bool {
		f.maps.mu.Lock()
		defer f.maps.mu.Unlock()
		return (f.maps.enforcement[dir] == 1) == on
	}
}

func all(conds ...func() bool) func() bool {
	return func() bool {
		for _, c := range conds {
			if !c() {
				return false
			}
		}
		return true
	}
}

func (f *orderFixture) unconverged() string {
	txn := f.db.ReadTxn()
	if init, _ := f.policy.Initialized(txn); !init {
		return "policy table not initialized"
	}
	if n := f.datapath.policyOps.numDraining(); n > 0 {
		p := f.datapath.policyOps
		p.mu.Lock()
		defer p.mu.Unlock()
		off, _ := p.order.switchedOff.Get()
		var held []string
		for k := range p.draining {
			id, _, _, _ := k.Fields()
			h, _ := p.order.heldIdentity(id)
			held = append(held, fmt.Sprintf("%d held=%v after=%+v", id, h, p.draining[k]))
		}
		return fmt.Sprintf("%d policy keys draining (%s); ipcache written %d (table %d), switched off %d (table %d)",
			n, strings.Join(held, "; "), written(p.order.ipcacheWriter), f.entries.Revision(txn), off, f.enforce.Revision(txn))
	}
	f.maps.mu.Lock()
	defer f.maps.mu.Unlock()
	wantIPCache := map[bpfmaps.IPCacheKey]bpfmaps.IPCacheValue{}
	for e, rev := range f.entries.All(txn) {
		if kind, err := f.datapath.IPCacheStatus(rev); kind != reconciler.StatusKindDone {
			return fmt.Sprintf("ipcache %s is %s (%v)", e.Prefix(), kind, err)
		}
		wantIPCache[bpfmaps.NewIPCacheKey(e.Prefix())] = bpfmaps.NewIPCacheValue(e.Identity)
	}
	if len(wantIPCache) != len(f.maps.ipcache) {
		return fmt.Sprintf("ipcache map has %d entries, the table %d", len(f.maps.ipcache), len(wantIPCache))
	}
	for k, v := range wantIPCache {
		if f.maps.ipcache[k] != v {
			return fmt.Sprintf("ipcache map %x differs", k)
		}
	}
	n := 0
	for e := range f.policy.All(txn) {
		if e.Status.Kind != reconciler.StatusKindDone {
			return fmt.Sprintf("policy %s is %s", e.Key, e.Status)
		}
		n++
	}
	if n != len(f.maps.policy) {
		return fmt.Sprintf("policy map has %d entries, the table %d", len(f.maps.policy), n)
	}
	for e := range f.enforce.All(txn) {
		want := uint32(0)
		if e.Enforced {
			want = 1
		}
		if e.Status.Kind != reconciler.StatusKindDone || f.maps.enforcement[e.Direction] != want {
			return fmt.Sprintf("enforcement %s is %s, map %d", e.Direction, e.Status, f.maps.enforcement[e.Direction])
		}
	}
	return ""
}

// identityOf returns what the ipcache map gives addr now.
func (f *orderFixture) identityOf(addr string) uint32 {
	f.maps.mu.Lock()
	defer f.maps.mu.Unlock()
	return f.maps.identityOf(netip.MustParseAddr(addr))
}

func (f *orderFixture) noViolations(what string) {
	f.t.Helper()
	v := f.maps.takeViolations()
	require.Empty(f.t, v, "%s: a watched address was dropped in between (%d violations)", what, len(v))
}

const pinged = "10.1.2.3"

// TestOrderFirstAndLastPolicy: the first egress policy, with 2,000 other
// prefixes, allows the address; then it goes. At no write in between is
// the address dropped: enforcement switches on after the entries are in
// both maps, and off before they go.
func TestOrderFirstAndLastPolicy(t *testing.T) {
	t.Parallel()
	f := newOrderFixture(t, 16384)
	f.converged("start", f.has())
	f.maps.watch(pinged, uint8(policy.Egress))
	others := hosts(2000)
	for round := range 3 {
		f.writePolicy("first.yaml", egressPolicy("first", append(others, `"10.1.0.0/16"`)...))
		f.converged("first policy", all(f.enforced(policy.Egress, true), f.size(len(others)+1)))
		require.NotEqual(t, uint32(identity.World), f.identityOf(pinged))
		f.removePolicy("first.yaml")
		f.converged("no policy", all(f.has(), f.enforced(policy.Egress, false)))
		f.noViolations(fmt.Sprintf("round %d", round))
	}
}

// TestOrderNarrowerPrefixComesAndGoes: inside an allowed /16, a /32 of the
// address with 2,000 other /32s gets identities of its own (a second
// policy names them), and goes again.
func TestOrderNarrowerPrefixComesAndGoes(t *testing.T) {
	t.Parallel()
	for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
		t.Run(dir.String(), func(t *testing.T) {
			t.Parallel()
			rule := func(cidrs ...string) string {
				if dir == policy.Egress {
					return "egress:\n  - toCIDR: [" + strings.Join(cidrs, ", ") + "]\n"
				}
				return "ingress:\n  - fromCIDR: [" + strings.Join(cidrs, ", ") + "]\n"
			}
			f := newOrderFixture(t, 16384)
			f.writePolicy("wide.yaml", "name: wide\n"+rule(`"10.1.0.0/16"`))
			f.converged("wide policy", all(f.has("10.1.0.0/16"), f.enforced(dir, true)))
			wide := f.identityOf(pinged)
			f.maps.watch(pinged, uint8(dir))
			for round := range 3 {
				f.writePolicy("narrow.yaml", "name: narrow\n"+rule(append(hosts(2000), `"10.1.2.3/32"`)...))
				f.converged("narrow policy", all(f.size(2002), func() bool { return f.identityOf(pinged) != wide }))
				f.removePolicy("narrow.yaml")
				f.converged("narrow policy gone", f.has("10.1.0.0/16"))
				require.Equal(t, wide, f.identityOf(pinged), "round %d: back to the /16", round)
				f.noViolations(fmt.Sprintf("round %d", round))
			}
		})
	}
}

// TestOrderPolicyEditSwapsTheCIDR: an edit swaps the allowing CIDR for
// another that covers the address, narrower and then wider.
func TestOrderPolicyEditSwapsTheCIDR(t *testing.T) {
	t.Parallel()
	f := newOrderFixture(t, 16384)
	f.writePolicy("p.yaml", egressPolicy("p", `"10.1.0.0/16"`))
	f.converged("/16", all(f.has("10.1.0.0/16"), f.enforced(policy.Egress, true)))
	f.maps.watch(pinged, uint8(policy.Egress))
	for round, cidr := range []string{"10.1.2.0/24", "10.0.0.0/8", "10.1.2.0/24", "10.1.0.0/16"} {
		f.writePolicy("p.yaml", egressPolicy("p", fmt.Sprintf("%q", cidr)))
		f.converged(cidr, f.has(cidr))
		f.noViolations(fmt.Sprintf("round %d: to %s", round, cidr))
	}
}

// TestOrderLabelsChange: another owner adds a label to the prefix that
// covers the address, and removes it: the prefix moves to a new identity
// and back.
func TestOrderLabelsChange(t *testing.T) {
	t.Parallel()
	f := newOrderFixture(t, 16384)
	f.writePolicy("p.yaml", egressPolicy("p", `"10.1.0.0/16"`))
	f.converged("policy", all(f.has("10.1.0.0/16"), f.enforced(policy.Egress, true)))
	before := f.identityOf(pinged)
	f.maps.watch(pinged, uint8(policy.Egress))
	h, err := f.ipcache.NewHandle("test/labels", source.Local)
	require.NoError(t, err)
	extra, err := labels.Parse("k8s:app=db")
	require.NoError(t, err)
	for round := range 3 {
		require.NoError(t, h.Upsert(netip.MustParsePrefix("10.1.0.0/16"), ipcachecell.Metadata{Labels: extra}))
		f.converged("label added", func() bool { return f.identityOf(pinged) != before })
		labeled := f.identityOf(pinged)
		require.NoError(t, h.Remove(netip.MustParsePrefix("10.1.0.0/16")))
		f.converged("label removed", func() bool { return f.identityOf(pinged) != labeled })
		before = f.identityOf(pinged)
		f.noViolations(fmt.Sprintf("round %d", round))
	}
}

// TestOrderFullPolicyMap: with no room in the policy map for the new /32's
// identity, the address keeps its old, allowed identity; the ipcache entry
// says why; once room appears, the address moves to its own identity.
func TestOrderFullPolicyMap(t *testing.T) {
	t.Parallel()
	f := newOrderFixture(t, 3)
	f.writePolicy("wide.yaml", egressPolicy("wide", `"10.1.0.0/16"`))
	f.writePolicy("other.yaml", egressPolicy("other", `"10.9.0.0/16"`, `"10.8.0.0/16"`))
	f.converged("two policies fill the map", f.has("10.1.0.0/16", "10.9.0.0/16", "10.8.0.0/16"))
	wide := f.identityOf(pinged)
	f.maps.watch(pinged, uint8(policy.Egress))

	f.writePolicy("narrow.yaml", egressPolicy("narrow", `"10.1.2.3/32"`))
	require.Eventually(t, func() bool {
		_, rev, found := f.entries.Get(f.db.ReadTxn(), ipcachecell.EntryIndex.Query(netip.MustParsePrefix("10.1.2.3/32")))
		kind, err := f.datapath.IPCacheStatus(rev)
		return found && kind == reconciler.StatusKindError && errors.Is(err, ErrPolicyEntriesNotWritten)
	}, 10*time.Second, 5*time.Millisecond, "the /32's entry is held with an error saying why")
	require.Equal(t, wide, f.identityOf(pinged), "the address keeps its old identity")
	f.noViolations("map full")

	f.removePolicy("other.yaml")
	f.converged("room appeared", f.has("10.1.0.0/16", "10.1.2.3/32"))
	require.NotEqual(t, wide, f.identityOf(pinged), "the address has its own identity once its entry is written")
	f.noViolations("after room appeared")
}

// TestRecordingMapsSeeADrop makes sure the check can fail: a policy entry
// deleted under an ipcache entry that points at it is a violation.
func TestRecordingMapsSeeADrop(t *testing.T) {
	t.Parallel()
	r := newRecordingMaps(t, 10)
	m := r.maps()
	k, v := bpfmaps.NewIPCacheKey(netip.MustParsePrefix("10.1.0.0/16")), bpfmaps.NewIPCacheValue(16777217)
	require.NoError(t, m.ipcache.Put(&k, &v))
	pk, pv := policyMapKey(16777217, uint8(policy.Egress), 0, 0), bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))
	require.NoError(t, m.policy.Put(&pk, &pv))
	dir, on := bpfmaps.NewEnforcementKey(0, policy.Egress), bpfmaps.EnforcementValue(1)
	require.NoError(t, m.enforcement.Put(&dir, &on))
	r.watch(pinged, uint8(policy.Egress))
	require.NoError(t, m.policy.Delete(&pk))
	require.Len(t, r.takeViolations(), 1)
	require.True(t, errors.Is(m.policy.Delete(&pk), ebpf.ErrKeyNotExist))
}

// TestOrderReleasedHandle: an owner other than the policies (restore, an
// embedding agent) holds the address's /32 and 2,000 others inside an
// allowed /16, then releases its handle at once, as restore does after the
// grace period: the address falls back to the /16 without a drop.
func TestOrderReleasedHandle(t *testing.T) {
	t.Parallel()
	f := newOrderFixture(t, 16384)
	f.writePolicy("wide.yaml", egressPolicy("wide", `"10.1.0.0/16"`))
	f.converged("wide policy", all(f.has("10.1.0.0/16"), f.enforced(policy.Egress, true)))
	wide := f.identityOf(pinged)
	f.maps.watch(pinged, uint8(policy.Egress))
	for round := range 3 {
		h, err := f.ipcache.NewHandle("test/owner", source.Restored)
		require.NoError(t, err)
		batch := []ipcachecell.PrefixUpsert{{Prefix: netip.MustParsePrefix(pinged + "/32")}}
		for i := range 2000 {
			batch = append(batch, ipcachecell.PrefixUpsert{Prefix: netip.MustParsePrefix(fmt.Sprintf("10.1.%d.%d/32", 100+i/250, i%250+1))})
		}
		require.NoError(t, h.UpsertBatch(batch))
		f.converged("owner's prefixes", all(f.size(2002), func() bool { return f.identityOf(pinged) != wide }))
		require.NoError(t, h.Release())
		f.converged("released", f.has("10.1.0.0/16"))
		require.Equal(t, wide, f.identityOf(pinged))
		f.noViolations(fmt.Sprintf("round %d", round))
	}
}
