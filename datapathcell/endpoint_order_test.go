// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// subjectMaps are recording fakes of the endpoints map, the outer policy
// map with its subjects' maps, and the enforcement map (a hash by subject
// and direction), sharing recordingMaps' lock and its check after every
// single key written. The check decides a packet of a watched local
// address as the program does: its subject from the endpoints map (0 if
// none), that subject's enforcement, then its policy map's entries for
// the remote identity (world: no ipcache entry) and for identity 0.
type subjectMaps struct {
	r           *recordingMaps
	endpoints   map[bpfmaps.EndpointKey]bpfmaps.EndpointValue
	outer       map[uint32]*fakeMap[bpfmaps.PolicyKey, bpfmaps.PolicyValue]
	enforcement map[bpfmaps.EnforcementKey]bpfmaps.EnforcementValue
	policyMax   int
	// expected are, by subject, the policy entries and enforcement that
	// must be in the maps whenever an endpoints entry points at it.
	expected map[identity.Number]expectedSubject
	// made and closed count the subjects' maps created and closed.
	made, closed int
	// sending are the addresses a workload sends from, by the device it
	// sends on: once that device's key is in the endpoints map, the
	// address must be there too, bound to it (else its traffic is
	// dropped as spoofed).
	sending map[netip.Addr]uint32
	// filter, if set, is the program's endpoint_absent as the datapath
	// last set it: no address in the endpoints map may be in a slot it
	// skips.
	filter func() *endpointFilter
	// words, if set, are the program's endpoint_words as the datapath
	// last set them: each must say what the endpoints map holds for its
	// address.
	words func() endpointWords
}

type expectedSubject struct {
	entries     map[bpfmaps.PolicyKey]bpfmaps.PolicyValue
	enforcement map[policy.Direction]bpfmaps.EnforcementValue
}

func newSubjectMaps(t *testing.T) *subjectMaps {
	s := &subjectMaps{
		r:           newRecordingMaps(t, 1<<16),
		endpoints:   map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{},
		outer:       map[uint32]*fakeMap[bpfmaps.PolicyKey, bpfmaps.PolicyValue]{},
		enforcement: map[bpfmaps.EnforcementKey]bpfmaps.EnforcementValue{},
		policyMax:   1 << 16,
		expected:    map[identity.Number]expectedSubject{},
	}
	s.r.check = s.check
	return s
}

func (s *subjectMaps) maps() *writtenMaps {
	base := s.r.maps()
	base.enforcement = &fakeMap[bpfmaps.EnforcementKey, bpfmaps.EnforcementValue]{r: s.r, entries: s.enforcement}
	base.endpoints = &fakeMap[bpfmaps.EndpointKey, bpfmaps.EndpointValue]{r: s.r, entries: s.endpoints}
	base.policies = &fakeOuter{s: s}
	base.newPolicy = func() (innerPolicy, error) {
		s.r.mu.Lock()
		defer s.r.mu.Unlock()
		s.made++
		m := &fakeMap[bpfmaps.PolicyKey, bpfmaps.PolicyValue]{r: s.r, entries: map[bpfmaps.PolicyKey]bpfmaps.PolicyValue{},
			max: func() int { return s.policyMax }}
		return innerPolicy{write: m, handle: m, close: func() error {
			s.r.mu.Lock()
			defer s.r.mu.Unlock()
			s.closed++
			return nil
		}}, nil
	}
	base.pinnedPolicies = func() (map[identity.Number]innerPolicy, error) {
		s.r.mu.Lock()
		defer s.r.mu.Unlock()
		out := map[identity.Number]innerPolicy{}
		for id, m := range s.outer {
			out[identity.Number(id)] = innerPolicy{write: m, handle: m, close: func() error {
				s.r.mu.Lock()
				defer s.r.mu.Unlock()
				s.closed++
				return nil
			}}
		}
		return out, nil
	}
	return base
}

// check is recordingMaps.check: r.mu held.
func (s *subjectMaps) check() []string {
	var violations []string
	for addr, dir := range s.r.watched {
		if !s.allowedLocked(addr, policy.Direction(dir)) {
			violations = append(violations, fmt.Sprintf("%s %s dropped", addr, policy.Direction(dir)))
		}
	}
	if s.filter != nil {
		if f := s.filter(); f != nil {
			for k := range s.endpoints {
				if slot := endpointSlot(k); f[slot/64]&(1<<(slot%64)) != 0 {
					addr, _ := k.Addr()
					violations = append(violations, fmt.Sprintf("%s is in a slot the program skips", addr))
				}
			}
		}
	}
	if s.words != nil {
		for slot, word := range s.words() {
			var a [4]byte
			binary.LittleEndian.PutUint32(a[:], uint32(word))
			k := bpfmaps.NewEndpointKey(netip.AddrFrom4(a))
			v, ok := s.endpoints[k]
			if want, fits := endpointWord(k, v); !ok || !fits || want != word || endpointSlot(k) != slot {
				violations = append(violations, fmt.Sprintf("the word of %s (slot %d) says %#x, the map %v (in it: %t)", netip.AddrFrom4(a), slot, word, v, ok))
			}
		}
	}
	for k, v := range s.endpoints {
		want, ok := s.expected[v.Identity()]
		if !ok {
			continue
		}
		addr, _ := k.Addr()
		inner := s.outer[uint32(v.Identity())]
		for pk, pv := range want.entries {
			if inner == nil || inner.entries[pk] != pv {
				violations = append(violations, fmt.Sprintf("%s points at subject %d without its policy entry %x", addr, v.Identity(), pk))
			}
		}
		for dir, ev := range want.enforcement {
			if s.enforcement[bpfmaps.NewEnforcementKey(v.Identity(), dir)] != ev {
				violations = append(violations, fmt.Sprintf("%s points at subject %d without its %s enforcement", addr, v.Identity(), dir))
			}
		}
	}
	for addr, ifindex := range s.sending {
		if _, bound := s.endpoints[bpfmaps.NewEndpointDeviceKey(ifindex)]; !bound {
			continue
		}
		if v, ok := s.endpoints[bpfmaps.NewEndpointKey(addr)]; !ok || v.Ifindex() != ifindex {
			violations = append(violations, fmt.Sprintf("%s sends on device %d, which has endpoints, and is not bound to it: spoofed", addr, ifindex))
		}
	}
	// A tagged frame could be any endpoint's: while one's direction is
	// enforced, tagged frames are dropped in it.
	for k, v := range s.enforcement {
		subject := k.Subject()
		if subject == identity.Unknown || subject == bpfmaps.TaggedSubject || v == bpfmaps.EnforceNone {
			continue
		}
		if s.enforcement[bpfmaps.NewEnforcementKey(bpfmaps.TaggedSubject, k.Direction())] == bpfmaps.EnforceNone {
			violations = append(violations, fmt.Sprintf("subject %d's %s is enforced and tagged frames pass", subject, k.Direction()))
		}
	}
	return violations
}

func (s *subjectMaps) allowedLocked(addr netip.Addr, dir policy.Direction) bool {
	subject := identity.Number(0)
	if v, ok := s.endpoints[bpfmaps.NewEndpointKey(addr)]; ok {
		subject = v.Identity()
	}
	mode := s.enforcement[bpfmaps.NewEnforcementKey(subject, dir)]
	if mode == bpfmaps.EnforceNone {
		return true
	}
	entries := s.r.policy
	if subject != 0 {
		entries = nil
		if m := s.outer[uint32(subject)]; m != nil {
			entries = m.entries
		}
	}
	verdicts := map[uint32]bool{}
	for _, id := range []uint32{uint32(identity.World), 0} {
		if v, ok := entries[policyMapKey(id, uint8(dir), 0, 0)]; ok {
			verdicts[v.Verdict()] = true
		}
	}
	switch {
	case verdicts[uint32(policy.VerdictDeny)]:
		return false
	case verdicts[uint32(policy.VerdictAllow)]:
		return true
	}
	return mode == bpfmaps.EnforceDenyOnly
}

// fakeOuter is the outer policy map: a subject to its map.
type fakeOuter struct{ s *subjectMaps }

func (o *fakeOuter) Put(key, value any) error {
	o.s.r.mu.Lock()
	defer o.s.r.mu.Unlock()
	id := *key.(*uint32)
	o.s.outer[id] = value.(*fakeMap[bpfmaps.PolicyKey, bpfmaps.PolicyValue])
	o.s.r.wrote(fmt.Sprintf("outer[%d] = its map", id))
	return nil
}

func (o *fakeOuter) Delete(key any) error {
	o.s.r.mu.Lock()
	defer o.s.r.mu.Unlock()
	id := *key.(*uint32)
	if _, ok := o.s.outer[id]; !ok {
		return ebpf.ErrKeyNotExist
	}
	delete(o.s.outer, id)
	o.s.r.wrote(fmt.Sprintf("outer[%d] deleted", id))
	return nil
}

func (o *fakeOuter) Lookup(any, any) error { return ebpf.ErrNotSupported }
func (o *fakeOuter) BatchUpdate(any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (o *fakeOuter) BatchDelete(any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (o *fakeOuter) BatchLookup(*ebpf.MapBatchCursor, any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (o *fakeOuter) Iterate() *ebpf.MapIterator { panic("not iterated") }
func (o *fakeOuter) MaxEntries() uint32         { return bpfmaps.PolicySubjects }

// selectorsStandIn is policy.Progress as the selectors keep it: the
// tables reflect the `endpoints` table up to the revision computed says,
// which the test sets once it wrote the policy rows that follow.
type selectorsStandIn struct {
	db          *statedb.DB
	endpoints   statedb.Table[*endpoint.State]
	entries     statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]
	computed    *progress.Tracker[statedb.Revision]
	mu          sync.Mutex
	// asked is the highest endpoints revision a WaitComputed asked for
	// (the endpoints writer's: the ipcache writer, the other caller, has
	// nothing to write in these tests).
	asked statedb.Revision
}

func (p *selectorsStandIn) WaitComputed(ctx context.Context, txn statedb.ReadTxn) (policy.Computed, error) {
	want := p.endpoints.Revision(txn)
	p.mu.Lock()
	p.asked = max(p.asked, want)
	p.mu.Unlock()
	if _, err := p.computed.Wait(ctx, func(rev statedb.Revision) bool { return rev >= want }); err != nil {
		return policy.Computed{}, err
	}
	now := p.db.ReadTxn()
	return policy.Computed{Entries: p.entries.Revision(now), Enforcement: p.enforcement.Revision(now)}, nil
}

// endpointFixture is the datapath's writers over subjectMaps, with the
// tables written by the test: the endpoint cell's rows, and the
// selectors' rows for them.
type endpointFixture struct {
	t           *testing.T
	maps        *subjectMaps
	h           *hive.Hive
	db          *statedb.DB
	endpoints   statedb.RWTable[*endpoint.State]
	entries     statedb.RWTable[*policy.Entry]
	enforcement statedb.RWTable[*policy.Enforcement]
	selectors   *selectorsStandIn
	datapath    *Datapath
	// initialize completes the tables' initialization, which the first
	// compute does: the endpoints and the policy rows that follow from
	// them are there (a restart's endpoints are registered again).
	initialize []func(statedb.WriteTxn)
}

func newEndpointFixture(t *testing.T, maps *subjectMaps) *endpointFixture {
	return newEndpointFixtureOn(t, maps, "")
}

// newEndpointFixtureOn is newEndpointFixture over the real pinned maps in
// bpfRoot if maps is nil.
func newEndpointFixtureOn(t *testing.T, maps *subjectMaps, bpfRoot string) *endpointFixture {
	f := &endpointFixture{t: t, maps: maps}
	f.h = hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(cell.NewSimpleHealth),
		cell.Module("test-tables", "The tables the test writes",
			cell.Provide(
				func(db *statedb.DB) (statedb.RWTable[*ipcachecell.Entry], error) {
					return ipcachecell.NewEntriesTable(db)
				},
				statedb.RWTable[*ipcachecell.Entry].ToTable,
				func(t statedb.RWTable[*ipcachecell.Entry]) ipcachecell.ReconcilerTable {
					return ipcachecell.ReconcilerTable{RWTable: t}
				},
				policy.NewEntryTable,
				statedb.RWTable[*policy.Entry].ToTable,
				func(t statedb.RWTable[*policy.Entry]) policy.ReconcilerTable {
					return policy.ReconcilerTable{RWTable: t}
				},
				policy.NewEnforcementTable,
				statedb.RWTable[*policy.Enforcement].ToTable,
				func(t statedb.RWTable[*policy.Enforcement]) policy.EnforcementReconcilerTable {
					return policy.EnforcementReconcilerTable{RWTable: t}
				},
				endpoint.NewTable,
				statedb.RWTable[*endpoint.State].ToTable,
				func(db *statedb.DB, e statedb.Table[*endpoint.State], p statedb.Table[*policy.Entry], en statedb.Table[*policy.Enforcement]) policy.Progress {
					f.selectors = &selectorsStandIn{db: db, endpoints: e, entries: p, enforcement: en, computed: progress.New[statedb.Revision](0)}
					return f.selectors
				},
			),
		),
		Cell,
		cell.Invoke(func(d *Datapath, db *statedb.DB, e statedb.RWTable[*endpoint.State], p statedb.RWTable[*policy.Entry],
			en statedb.RWTable[*policy.Enforcement], ip statedb.RWTable[*ipcachecell.Entry]) {
			if maps != nil {
				d.fakeMaps = maps.maps()
				maps.filter = func() *endpointFilter {
					d.mu.Lock()
					defer d.mu.Unlock()
					return d.endpointFilter
				}
				maps.words = func() endpointWords {
					d.mu.Lock()
					defer d.mu.Unlock()
					return d.endpointWords
				}
			}
			f.datapath, f.db, f.endpoints, f.entries, f.enforcement = d, db, e, p, en
			// The ipcache table is initialized and stays empty; the others
			// at the first compute.
			txn := db.WriteTxn(e, p, en, ip)
			ip.RegisterInitializer(txn, "test")(txn)
			f.initialize = []func(statedb.WriteTxn){e.RegisterInitializer(txn, "test"), p.RegisterInitializer(txn, "test"),
				en.RegisterInitializer(txn, "test")}
			txn.Commit()
		}),
	)
	if bpfRoot != "" {
		hive.AddConfigOverride(f.h, func(c *Config) { c.BPFRoot = bpfRoot })
	}
	log := hivetest.Logger(t)
	require.NoError(t, f.h.Start(log, context.Background()))
	return f
}

func (f *endpointFixture) stop() {
	require.NoError(f.t, f.h.Stop(hivetest.Logger(f.t), context.Background()))
}

// filterSkips reports whether the program is told to skip the lookup of
// addr (endpoint_absent).
func (f *endpointFixture) filterSkips(addr string) bool {
	slot := endpointSlot(bpfmaps.NewEndpointKey(netip.MustParseAddr(addr)))
	filter := f.maps.filter()
	return filter != nil && filter[slot/64]&(1<<(slot%64)) != 0
}

// local is an endpoint row of this node.
func local(name string, id identity.Number, addrs ...string) *endpoint.State {
	s := &endpoint.State{Endpoint: endpoint.Endpoint{Namespace: "default", Name: name}, Identity: id, Local: true}
	for _, a := range addrs {
		s.Addresses = append(s.Addresses, netip.MustParseAddr(a))
	}
	return s
}

// upsertEndpoint writes the endpoint cell's row, as the endpoint cell
// does before the selectors see it, and returns its revision.
func (f *endpointFixture) upsertEndpoint(s *endpoint.State) statedb.Revision {
	txn := f.db.WriteTxn(f.endpoints)
	_, _, err := f.endpoints.Insert(txn, s)
	require.NoError(f.t, err)
	txn.Commit()
	_, rev, _ := f.endpoints.Get(f.db.ReadTxn(), endpoint.NameIndex.Query(s.ID()))
	return rev
}

func (f *endpointFixture) deleteEndpoint(s *endpoint.State) {
	txn := f.db.WriteTxn(f.endpoints)
	_, _, err := f.endpoints.Delete(txn, s)
	require.NoError(f.t, err)
	txn.Commit()
}

// subjectPolicy are the rows the selectors write for subject: an egress
// policy that allows every peer (enforced), and an ingress policy that
// allows nothing (enforced: default deny). ingressDeny adds a deny of
// every peer's ingress instead.
func subjectRows(subject identity.Number) ([]*policy.Entry, []*policy.Enforcement) {
	return []*policy.Entry{{Key: policy.Key{Subject: subject, Identity: 0, Direction: policy.Egress}, Verdict: policy.VerdictAllow, Status: reconciler.StatusPending()}},
		[]*policy.Enforcement{
			{Subject: subject, Direction: policy.Egress, Enforced: true},
			{Subject: subject, Direction: policy.Ingress, Enforced: true},
		}
}

func (f *endpointFixture) expect(subject identity.Number) {
	entries, rows := subjectRows(subject)
	want := expectedSubject{entries: map[bpfmaps.PolicyKey]bpfmaps.PolicyValue{}, enforcement: map[policy.Direction]bpfmaps.EnforcementValue{}}
	for _, e := range entries {
		want.entries[bpfmaps.NewPolicyKey(e.Key)] = bpfmaps.NewPolicyValue(uint32(e.Verdict))
	}
	for _, r := range rows {
		want.enforcement[r.Direction] = enforcementOf(r)
	}
	f.maps.r.mu.Lock()
	defer f.maps.r.mu.Unlock()
	f.maps.expected[subject] = want
}

// compute writes, as the selectors do after they saw the endpoints, the
// rows of the subjects add and deletes those of the subjects remove, and
// says the tables are computed for the endpoints as they are.
func (f *endpointFixture) compute(add, remove []identity.Number) {
	f.writeRows(add, remove)
	f.selectors.computed.Set(f.endpoints.Revision(f.db.ReadTxn()))
}

// computeUpTo is compute for the endpoints up to revision rev only, as
// when the selectors computed before later endpoints were written.
func (f *endpointFixture) computeUpTo(rev statedb.Revision, add []identity.Number) {
	f.writeRows(add, nil)
	f.selectors.computed.Set(rev)
}

// writeRows writes the rows of compute, and completes the tables'
// initialization the first time.
func (f *endpointFixture) writeRows(add, remove []identity.Number) {
	txn := f.db.WriteTxn(f.entries, f.enforcement, f.endpoints)
	for _, done := range f.initialize {
		done(txn)
	}
	f.initialize = nil
	for _, s := range add {
		entries, rows := subjectRows(s)
		for _, e := range entries {
			_, _, err := f.entries.Insert(txn, e)
			require.NoError(f.t, err)
		}
		for _, r := range rows {
			_, _, err := f.enforcement.Insert(txn, r)
			require.NoError(f.t, err)
		}
	}
	for _, s := range remove {
		entries, rows := subjectRows(s)
		for _, e := range entries {
			_, _, err := f.entries.Delete(txn, e)
			require.NoError(f.t, err)
		}
		for _, r := range rows {
			_, _, err := f.enforcement.Delete(txn, r)
			require.NoError(f.t, err)
		}
	}
	txn.Commit()
}

func (f *endpointFixture) waitWritten(s *endpoint.State, rev statedb.Revision) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return f.datapath.WaitEnforced(ctx, s.ID(), rev)
}

// state returns the subjects in the outer map, the endpoints map's
// entries by address, and the enforcement entries' count.
func (f *endpointFixture) state() (subjects []uint32, endpoints map[string]identity.Number, enforcement int) {
	f.maps.r.mu.Lock()
	defer f.maps.r.mu.Unlock()
	for id := range f.maps.outer {
		subjects = append(subjects, id)
	}
	endpoints = map[string]identity.Number{}
	for k, v := range f.maps.endpoints {
		if a, err := k.Addr(); err == nil {
			endpoints[a.String()] = v.Identity()
		}
	}
	for k, v := range f.maps.enforcement {
		if k.Subject() != bpfmaps.TaggedSubject && v != bpfmaps.EnforceNone {
			enforcement++
		}
	}
	return subjects, endpoints, enforcement
}

// tagged returns the directions in which the enforcement map drops
// VLAN-tagged frames.
func (f *endpointFixture) tagged() (dirs []policy.Direction) {
	f.maps.r.mu.Lock()
	defer f.maps.r.mu.Unlock()
	for _, dir := range policy.Directions() {
		if f.maps.enforcement[bpfmaps.NewEnforcementKey(bpfmaps.TaggedSubject, dir)] != bpfmaps.EnforceNone {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

func (f *endpointFixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	require.Eventually(f.t, cond, 20*time.Second, 5*time.Millisecond, what)
}

func (f *endpointFixture) noViolations(what string) {
	f.t.Helper()
	v := f.maps.r.takeViolations()
	require.Empty(f.t, v, "%s: %d violations", what, len(v))
}

func (f *endpointFixture) writes() int {
	f.maps.r.mu.Lock()
	defer f.maps.r.mu.Unlock()
	return f.maps.r.writes
}

const (
	web1, web2 = "10.0.1.5", "fd00::5"
	subjectA   = identity.Number(300)
	subjectB   = identity.Number(301)
)

// An endpoint written while the writer's round waits for the selectors,
// after the round read its rows, is not in that round: WaitEnforced must
// not take it for deleted, and returns only once its entries are in the
// map. (The round published as seen the revision of the transaction
// taken after the wait, and WaitEnforced returned at once.) The selectors
// compute for the first endpoint only, so that the second's round waits
// and WaitEnforced cannot be right by chance.
func TestOrderEndpointWrittenDuringARound(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	f := newEndpointFixture(t, maps)
	defer f.stop()
	f.expect(subjectA)
	// The subject's rows first, and its enforcement in the map, so that
	// the round below writes its endpoint at once.
	f.compute([]identity.Number{subjectA}, nil)
	f.eventually("the subject's enforcement is in", func() bool {
		_, _, enforcement := f.state()
		return enforcement == 2
	})
	first := local("web-1", subjectA, web1)
	rev1 := f.upsertEndpoint(first)
	f.eventually("the writer read web-1's row and waits for the selectors", func() bool {
		f.selectors.mu.Lock()
		defer f.selectors.mu.Unlock()
		return f.selectors.asked >= rev1
	})
	second := local("web-2", subjectA, web2)
	rev2 := f.upsertEndpoint(second)
	f.computeUpTo(rev1, nil)
	require.NoError(t, f.waitWritten(first, rev1))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, f.datapath.WaitEnforced(ctx, second.ID(), rev2), context.DeadlineExceeded,
		"WaitEnforced returned before the endpoint's entry was in the map")
	_, inMap, _ := f.state()
	require.NotContains(t, inMap, web2, "written before the selectors computed for it")

	f.compute(nil, nil)
	require.NoError(t, f.waitWritten(second, rev2))
	_, inMap, _ = f.state()
	require.Equal(t, subjectA, inMap[web2], "WaitEnforced returned before the endpoint's entry was in the map")
	f.noViolations("an endpoint written during a round")
}

// TestOrderEndpoint: an endpoint is added, relabelled (a new identity)
// and removed, and the agent restarts, under a check after every single
// key written: its egress, which both identities allow (and the host-wide
// default, not enforced, too), is never dropped; whenever an endpoints
// entry points at a subject, the subject's policy entries and enforcement
// are in the maps (so a flow its policy denies is denied from the first
// packet); WaitEnforced returns once the entries are in; a removal leaves
// nothing; a restart writes nothing.
func TestOrderEndpoint(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	f := newEndpointFixture(t, maps)
	maps.r.watch(web1, uint8(policy.Egress))
	maps.r.watch(web2, uint8(policy.Egress))
	f.expect(subjectA)
	f.expect(subjectB)

	// Add: the endpoint's row comes before the selectors computed its
	// subject's rows; its entries wait for them.
	ep := local("web-1", subjectA, web1, web2)
	rev := f.upsertEndpoint(ep)
	time.Sleep(50 * time.Millisecond)
	_, inMap, _ := f.state()
	require.Empty(t, inMap, "nothing is written before the subject's policy is computed")
	f.compute([]identity.Number{subjectA}, nil)
	require.NoError(t, f.waitWritten(ep, rev))
	subjects, inMap, _ := f.state()
	require.Equal(t, []uint32{uint32(subjectA)}, subjects)
	require.Equal(t, map[string]identity.Number{web1: subjectA, web2: subjectA}, inMap)
	f.noViolations("add")
	require.Equal(t, policy.Directions(), f.tagged(), "tagged frames are dropped where the endpoint is enforced")
	// The program looks up the slots of the two addresses, and skips the
	// others.
	f.eventually("the program is told the slots", func() bool {
		return f.filterSkips(web1) == false && f.filterSkips(web2) == false && f.filterSkips("10.99.0.1")
	})

	// Relabel: a new identity; the old one's rows go in the same round of
	// the selectors.
	ep = local("web-1", subjectB, web1, web2)
	rev = f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectB}, []identity.Number{subjectA})
	require.NoError(t, f.waitWritten(ep, rev))
	f.eventually("the old subject goes", func() bool {
		subjects, inMap, enforcement := f.state()
		return len(subjects) == 1 && subjects[0] == uint32(subjectB) && inMap[web1] == subjectB && enforcement == 2
	})
	f.noViolations("relabel")

	// Restart: nothing is written for what did not change.
	f.stop()
	before := f.writes()
	f = newEndpointFixture(t, maps)
	rev = f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectB}, nil)
	require.NoError(t, f.waitWritten(ep, rev))
	time.Sleep(100 * time.Millisecond) // a round of each writer
	require.Equal(t, before, f.writes(), "a restart writes no unchanged entry")
	subjects, inMap, _ = f.state()
	require.Equal(t, []uint32{uint32(subjectB)}, subjects)
	require.Equal(t, map[string]identity.Number{web1: subjectB, web2: subjectB}, inMap)

	// Remove: the endpoints entries go first, then the subject's
	// enforcement and policy map.
	f.deleteEndpoint(ep)
	f.compute(nil, []identity.Number{subjectB})
	f.eventually("nothing left", func() bool {
		subjects, inMap, enforcement := f.state()
		return len(subjects) == 0 && len(inMap) == 0 && enforcement == 0 && len(f.tagged()) == 0
	})
	require.NoError(t, f.waitWritten(ep, f.endpoints.Revision(f.db.ReadTxn())))
	f.noViolations("remove")
	f.eventually("the removed addresses' slots are skipped", func() bool { return f.filterSkips(web1) && f.filterSkips(web2) })
	maps.r.mu.Lock()
	require.Equal(t, maps.made, maps.closed, "every subject's map is closed once released (300 in the first run, 301 in the second)")
	maps.r.mu.Unlock()
	f.stop()
}

// TestOrderEndpointSeesAViolation makes sure the check can fail: an
// endpoints entry that points at a subject whose policy is not in the
// maps is a violation.
func TestOrderEndpointSeesAViolation(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	w := maps.maps()
	entries, _ := subjectRows(subjectA)
	maps.expected[subjectA] = expectedSubject{entries: map[bpfmaps.PolicyKey]bpfmaps.PolicyValue{
		bpfmaps.NewPolicyKey(entries[0].Key): bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))}}
	k, v := bpfmaps.NewEndpointKey(netip.MustParseAddr(web1)), bpfmaps.NewEndpointValue(subjectA, 0)
	require.NoError(t, w.endpoints.Put(&k, &v))
	require.NotEmpty(t, maps.r.takeViolations())
}

// TestTooManySubjects: a subject beyond the bound gets no policy map: its
// rows say why, its endpoint is held back (WaitEnforced says why) and
// nothing crashes; the first subject's endpoint is written.
func TestTooManySubjects(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	f := newEndpointFixture(t, maps)
	defer f.stop()
	f.datapath.subjects.mu.Lock()
	f.datapath.subjects.max = 1
	f.datapath.subjects.mu.Unlock()

	// One after the other: which of two new subjects gets the last map
	// is the order the policy writer sees their rows in.
	a, b := local("a", subjectA, web1), local("b", subjectB, web2)
	revA := f.upsertEndpoint(a)
	f.compute([]identity.Number{subjectA}, nil)
	require.NoError(t, f.waitWritten(a, revA))
	revB := f.upsertEndpoint(b)
	f.compute([]identity.Number{subjectB}, nil)
	err := f.waitWritten(b, revB)
	require.ErrorIs(t, err, ErrTooManySubjects)
	f.eventually("the row of the subject beyond the bound says why", func() bool {
		for e := range f.entries.All(f.db.ReadTxn()) {
			if e.Key.Subject == subjectB {
				return e.Status.Kind == reconciler.StatusKindError && e.Status.Error != nil && strings.Contains(*e.Status.Error, ErrTooManySubjects.Error())
			}
		}
		return false
	})
	_, inMap, _ := f.state()
	require.Equal(t, map[string]identity.Number{web1: subjectA}, inMap)
}

// TestEndpointDeviceMissing: an endpoint behind a device that does not
// exist is held back, and WaitEnforced says why; once the device resolves
// its entry is written bound to the device's ifindex.
func TestEndpointDeviceMissing(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	f := newEndpointFixture(t, maps)
	defer f.stop()
	ep := local("web-1", subjectA, web1)
	ep.Interface = "ia-no-such-dev"
	rev := f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectA}, nil)
	require.ErrorIs(t, f.waitWritten(ep, rev), ErrDeviceNotFound)
	_, inMap, _ := f.state()
	require.Empty(t, inMap)

	// The device appears (the lookup is the seam a devices table fills).
	f.datapath.endpoints.mu.Lock()
	f.datapath.endpoints.retry = 10 * time.Millisecond
	f.datapath.endpoints.mu.Unlock()
	f.datapath.endpoints.setIfindex(func(name string) (uint32, error) {
		if name == ep.Interface {
			return 42, nil
		}
		return interfaceIndex(name)
	})
	f.eventually("written once the device exists", func() bool {
		maps.r.mu.Lock()
		defer maps.r.mu.Unlock()
		v, ok := maps.endpoints[bpfmaps.NewEndpointKey(netip.MustParseAddr(web1))]
		return ok && v.Ifindex() == 42 && v.Identity() == subjectA
	})
	// The round that wrote it publishes the row's revision at its end.
	f.eventually("WaitEnforced returns once the entry is in", func() bool { return f.waitWritten(ep, rev) == nil })
}

// TestPrivilegedEndpointWriters: the same add, relabel, restart and
// removal through the real pinned maps (no program: the maps' content is
// checked): the endpoints entries, the subject's map in the outer policy
// map with its entry, the subject's enforcement entries; the old
// subject's gone after a relabel; a restart writes nothing; a removal
// leaves no entry of the subject.
func TestPrivilegedEndpointWriters(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	root := filepath.Join(t.TempDir(), "bpf")
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	pinned := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(root), name), nil)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	endpointsOf := func() map[string]identity.Number {
		out := map[string]identity.Number{}
		require.NoError(t, bpfmaps.ReadEntries(pinned(bpfmaps.EndpointsName), func(k bpfmaps.EndpointKey, v bpfmaps.EndpointValue) {
			a, err := k.Addr()
			require.NoError(t, err)
			out[a.String()] = v.Identity()
		}))
		return out
	}
	enforcementOfSubject := func(id identity.Number) map[policy.Direction]bpfmaps.EnforcementValue {
		out := map[policy.Direction]bpfmaps.EnforcementValue{}
		require.NoError(t, bpfmaps.ReadEntries(pinned(bpfmaps.EnforcementName), func(k bpfmaps.EnforcementKey, v bpfmaps.EnforcementValue) {
			if k.Subject() == id && v != bpfmaps.EnforceNone {
				out[k.Direction()] = v
			}
		}))
		return out
	}
	// hasPolicy reports whether the subject has a map in the outer map
	// and, if so, whether it holds the egress allow of subjectRows.
	hasPolicy := func(id identity.Number) (present, entry bool) {
		m, err := bpfmaps.PolicyOf(pinned(bpfmaps.PolicyName), id)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, false
		}
		require.NoError(t, err)
		defer m.Close()
		rows, _ := subjectRows(id)
		k := bpfmaps.NewPolicyKey(rows[0].Key)
		var v bpfmaps.PolicyValue
		return true, m.Lookup(&k, &v) == nil && v.Verdict() == uint32(policy.VerdictAllow)
	}
	enforced := map[policy.Direction]bpfmaps.EnforcementValue{policy.Ingress: bpfmaps.EnforceDefaultDeny, policy.Egress: bpfmaps.EnforceDefaultDeny}

	f := newEndpointFixtureOn(t, nil, root)
	ep := local("web-1", subjectA, web1, web2)
	rev := f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectA}, nil)
	require.NoError(t, f.waitWritten(ep, rev))
	require.Equal(t, map[string]identity.Number{web1: subjectA, web2: subjectA}, endpointsOf())
	present, entry := hasPolicy(subjectA)
	require.True(t, present && entry, "the subject's map, with its entry, is in the outer map")
	require.Equal(t, enforced, enforcementOfSubject(subjectA))

	ep = local("web-1", subjectB, web1, web2)
	rev = f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectB}, []identity.Number{subjectA})
	require.NoError(t, f.waitWritten(ep, rev))
	require.Equal(t, map[string]identity.Number{web1: subjectB, web2: subjectB}, endpointsOf())
	present, entry = hasPolicy(subjectB)
	require.True(t, present && entry)
	f.eventually("the old subject's map and enforcement go", func() bool {
		present, _ := hasPolicy(subjectA)
		return !present && len(enforcementOfSubject(subjectA)) == 0
	})
	f.stop()

	f = newEndpointFixtureOn(t, nil, root)
	rev = f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectB}, nil)
	require.NoError(t, f.waitWritten(ep, rev))
	time.Sleep(100 * time.Millisecond) // a round of each writer
	for _, name := range []string{bpfmaps.EndpointsName, bpfmaps.PolicyName, bpfmaps.EnforcementName} {
		written, _ := f.datapath.MapWrites(name)
		require.Zero(t, written, "a restart writes nothing to the %s map", name)
	}

	f.deleteEndpoint(ep)
	f.compute(nil, []identity.Number{subjectB})
	f.eventually("nothing of the endpoint left", func() bool {
		present, _ := hasPolicy(subjectB)
		return !present && len(enforcementOfSubject(subjectB)) == 0 && len(endpointsOf()) == 0
	})
	f.stop()
}

// TestEndpointDenyWithoutRoomDropsAll: a deny added to the policy of an
// endpoint in use, which its full map has no room for, switches that
// direction to dropping everything (the deny never fails open); once the
// map has room the deny is written, and only then does the direction
// enforce what its row says again.
func TestEndpointDenyWithoutRoomDropsAll(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	maps.policyMax = 1 // the allow of subjectRows
	f := newEndpointFixture(t, maps)
	defer f.stop()
	ep := local("web-1", subjectA, web1)
	rev := f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectA}, nil)
	require.NoError(t, f.waitWritten(ep, rev))

	enforcement := func(dir policy.Direction) bpfmaps.EnforcementValue {
		maps.r.mu.Lock()
		defer maps.r.mu.Unlock()
		return maps.enforcement[bpfmaps.NewEnforcementKey(subjectA, dir)]
	}
	require.Equal(t, bpfmaps.EnforceDefaultDeny, enforcement(policy.Egress))

	deny := &policy.Entry{Key: policy.Key{Subject: subjectA, Identity: identity.World, Direction: policy.Egress},
		Verdict: policy.VerdictDeny, Status: reconciler.StatusPending()}
	txn := f.db.WriteTxn(f.entries, f.enforcement)
	_, _, err := f.entries.Insert(txn, deny)
	require.NoError(t, err)
	_, _, err = f.enforcement.Insert(txn, &policy.Enforcement{Subject: subjectA, Direction: policy.Egress, Enforced: true, HasDeny: true})
	require.NoError(t, err)
	txn.Commit()
	f.eventually("the egress drops everything while the deny has no room", func() bool {
		return enforcement(policy.Egress) == bpfmaps.EnforceDropAll
	})
	require.Equal(t, bpfmaps.EnforceDefaultDeny, enforcement(policy.Ingress), "the other direction is untouched")
	require.Equal(t, []policy.Direction{policy.Ingress, policy.Egress}, f.tagged())

	denyKey := bpfmaps.NewPolicyKey(deny.Key)
	maps.r.mu.Lock()
	maps.policyMax = 2
	maps.r.mu.Unlock()
	f.eventually("once written, the egress enforces its row again", func() bool {
		return enforcement(policy.Egress) == bpfmaps.EnforceDefaultDeny
	})
	maps.r.mu.Lock()
	_, written := maps.outer[uint32(subjectA)].entries[denyKey]
	maps.r.mu.Unlock()
	require.True(t, written, "the deny is in the subject's map")
	f.noViolations("deny without room")
}

// TestEndpointDeviceKeys: the endpoints map says which devices endpoints
// are bound to (the program drops what such a device sends from another
// address) only while their addresses are in it, bound to the device: a
// device key is written after its addresses, moves with a device created
// again under a new ifindex, and goes before the addresses.
func TestEndpointDeviceKeys(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	f := newEndpointFixture(t, maps)
	defer f.stop()
	var ifindex atomic.Uint32
	ifindex.Store(7)
	f.datapath.endpoints.setIfindex(func(string) (uint32, error) { return ifindex.Load(), nil })
	deviceKeys := func() (devices []uint32) {
		maps.r.mu.Lock()
		defer maps.r.mu.Unlock()
		for k := range maps.endpoints {
			if d, ok := k.Device(); ok {
				devices = append(devices, d)
			}
		}
		return devices
	}
	sending := func(dev uint32) {
		maps.r.mu.Lock()
		defer maps.r.mu.Unlock()
		maps.sending = map[netip.Addr]uint32{netip.MustParseAddr(web1): dev, netip.MustParseAddr(web2): dev}
	}

	sending(7)
	ep := local("web-1", subjectA, web1, web2)
	ep.Interface = "veth-a"
	rev := f.upsertEndpoint(ep)
	f.compute([]identity.Number{subjectA}, nil)
	require.NoError(t, f.waitWritten(ep, rev))
	f.eventually("the device's key is written", func() bool { return slices.Equal(deviceKeys(), []uint32{7}) })
	f.noViolations("add")

	// The device is created again: a new ifindex, the workload sends there.
	ifindex.Store(8)
	sending(8)
	moved := *ep
	moved.Addresses = slices.Clone(ep.Addresses)
	rev = f.upsertEndpoint(&moved)
	f.compute(nil, nil)
	require.NoError(t, f.waitWritten(&moved, rev))
	f.eventually("the key moves to the new device", func() bool { return slices.Equal(deviceKeys(), []uint32{8}) })
	f.noViolations("device created again")

	f.deleteEndpoint(&moved)
	f.compute(nil, []identity.Number{subjectA})
	f.eventually("nothing left", func() bool {
		_, inMap, _ := f.state()
		return len(inMap) == 0 && len(deviceKeys()) == 0
	})
	f.noViolations("remove")
}
