// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// doneWriter is an ipcache writer that has written every revision.
type doneWriter struct{}

func (doneWriter) Prune() {}
func (doneWriter) WaitUntilReconciled(context.Context, statedb.Revision) (statedb.Revision, statedb.Revision, error) {
	return ^statedb.Revision(0), 0, nil
}

// newSubjectsUnderTest returns the subjects' writer over subjectMaps,
// with the tables it reads the revisions of.
func newSubjectsUnderTest(t *testing.T, maps *subjectMaps, max int) (*subjectPolicies, *statedb.DB) {
	db := statedb.New()
	ipcache, err := ipcachecell.NewEntriesTable(db)
	require.NoError(t, err)
	entries, err := policy.NewEntryTable(db)
	require.NoError(t, err)
	enforcement, err := policy.NewEnforcementTable(db)
	require.NoError(t, err)
	order := newOrdering(nil, nil, ipcache, entries, enforcement)
	order.ipcacheWriter = doneWriter{}
	order.uses.setEndpoints(map[identity.Number]int{})
	w := maps.maps()
	s := newSubjectPolicies(nil, &mapwrite.Stats{}, order, max)
	s.outer, s.create, s.pinned = func() mapwrite.Map { return w.policies }, w.newPolicy, w.pinnedPolicies
	return s, db
}

func subjectEntry(subject identity.Number, remote identity.Number) *policy.Entry {
	return &policy.Entry{Key: policy.Key{Subject: subject, Identity: remote, Direction: policy.Egress}, Verdict: policy.VerdictAllow}
}

func (s *subjectMaps) inOuter(id identity.Number) (map[bpfmaps.PolicyKey]bpfmaps.PolicyValue, bool) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	m, ok := s.outer[uint32(id)]
	if !ok {
		return nil, false
	}
	return m.entries, true
}

// TestSubjectMapLifetime: a subject's map is made and filled without
// being in the outer map; it enters the outer map, complete, when an
// endpoint is about to use it; it leaves only once no endpoint entry,
// enforcement entry or row uses it, and is then closed.
func TestSubjectMapLifetime(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	s, db := newSubjectsUnderTest(t, maps, 10)
	ctx := context.Background()
	batch := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(subjectA, 16777217)}, {Object: subjectEntry(subjectA, 16777218)}}
	s.update(ctx, db.ReadTxn(), batch)
	require.NoError(t, batch[0].Result)
	require.NoError(t, batch[1].Result)
	_, ok := maps.inOuter(subjectA)
	require.False(t, ok, "not in the outer map before an endpoint uses it")
	require.Equal(t, 1, maps.made)

	require.NoError(t, s.use(subjectA))
	entries, ok := maps.inOuter(subjectA)
	require.True(t, ok)
	require.Len(t, entries, 2, "complete when it enters the outer map")

	// An endpoint points at it, and it is enforced.
	s.order.uses.endpointMoved(0, subjectA)
	ek := bpfmaps.NewEnforcementKey(subjectA, policy.Egress)
	s.order.uses.setEnforcement(ek, bpfmaps.EnforceDefaultDeny)

	// Its rows go (the endpoint moved to another identity in the table):
	// the keys stay while the endpoint entry points at it.
	s.remove(db.ReadTxn(), []*policy.Entry{batch[0].Object, batch[1].Object})
	entries, ok = maps.inOuter(subjectA)
	require.True(t, ok)
	require.Len(t, entries, 2, "kept while an endpoints entry points at the subject")

	// The endpoint entry goes: the keys may go, the map stays while the
	// enforcement entry does.
	s.order.uses.endpointMoved(subjectA, 0)
	s.drainRound()
	entries, ok = maps.inOuter(subjectA)
	require.True(t, ok, "in the outer map while its enforcement entry is")
	require.Empty(t, entries)
	require.Equal(t, 0, maps.closed)

	s.order.uses.setEnforcement(ek, bpfmaps.EnforceNone)
	s.drainRound()
	_, ok = maps.inOuter(subjectA)
	require.False(t, ok, "released once nothing uses it")
	require.Equal(t, 1, maps.closed)
	maps.r.mu.Lock()
	require.Empty(t, maps.r.violations)
	maps.r.mu.Unlock()
}

// TestSubjectMapUnusedGoesAtOnce: the rows of a subject no endpoint ever
// used go with its map at once.
func TestSubjectMapUnusedGoesAtOnce(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	s, db := newSubjectsUnderTest(t, maps, 10)
	batch := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(subjectA, 16777217)}}
	s.update(context.Background(), db.ReadTxn(), batch)
	require.NoError(t, batch[0].Result)
	s.remove(db.ReadTxn(), []*policy.Entry{batch[0].Object})
	made, inOuter := s.count()
	require.Zero(t, made)
	require.Zero(t, inOuter)
	require.Equal(t, 1, maps.closed)
}

// TestSubjectMapBounds: a subject beyond the bound gets no map (its rows'
// error says so, nothing is made) until one goes; an entry that does not
// fit in a subject's map keeps the subject out of the outer map.
func TestSubjectMapBounds(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	s, db := newSubjectsUnderTest(t, maps, 1)
	ctx := context.Background()
	a := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(subjectA, 16777217)}}
	b := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(subjectB, 16777217)}}
	s.update(ctx, db.ReadTxn(), a)
	s.update(ctx, db.ReadTxn(), b)
	require.NoError(t, a[0].Result)
	require.ErrorIs(t, b[0].Result, ErrTooManySubjects)
	require.ErrorIs(t, s.use(subjectB), ErrTooManySubjects)
	require.Equal(t, 1, maps.made)

	s.remove(db.ReadTxn(), []*policy.Entry{a[0].Object})
	b = []reconciler.BatchEntry[*policy.Entry]{{Object: b[0].Object}}
	s.update(ctx, db.ReadTxn(), b)
	require.NoError(t, b[0].Result, "room once the other subject went")

	// A full map: the subject does not enter the outer map.
	maps.policyMax = 1
	more := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(subjectB, 16777218)}}
	s.update(ctx, db.ReadTxn(), more)
	require.Error(t, more[0].Result)
	require.ErrorIs(t, s.use(subjectB), ErrPolicyEntriesNotWritten)
	_, ok := maps.inOuter(subjectB)
	require.False(t, ok)
}

// TestSubjectMapRestart: the previous run's maps are taken over: writing
// the same entries again writes nothing, and one whose subject no
// endpoint uses any more goes at the prune.
func TestSubjectMapRestart(t *testing.T) {
	t.Parallel()
	maps := newSubjectMaps(t)
	s, db := newSubjectsUnderTest(t, maps, 10)
	ctx := context.Background()
	for _, id := range []identity.Number{subjectA, subjectB} {
		batch := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(id, 16777217)}}
		s.update(ctx, db.ReadTxn(), batch)
		require.NoError(t, batch[0].Result)
		require.NoError(t, s.use(id))
	}
	writes := maps.r.writes

	restarted, db := newSubjectsUnderTest(t, maps, 10)
	restarted.order.uses.setEndpoints(map[identity.Number]int{subjectA: 1})
	batch := []reconciler.BatchEntry[*policy.Entry]{{Object: subjectEntry(subjectA, 16777217)}}
	restarted.update(ctx, db.ReadTxn(), batch)
	require.NoError(t, batch[0].Result)
	require.NoError(t, restarted.use(subjectA))
	require.Equal(t, writes, maps.r.writes, "nothing written again")

	require.NoError(t, restarted.prune([]*policy.Entry{batch[0].Object}))
	_, ok := maps.inOuter(subjectB)
	require.False(t, ok, "the subject nothing uses went at the prune")
	_, ok = maps.inOuter(subjectA)
	require.True(t, ok)
}
