package policycell

import (
	"errors"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
)

// TestNotWrittenByFile: a file counts the rows of its policies whose
// status is Error, once per row even if several of its policies share it,
// with each distinct error once; rows Done or Pending do not count.
func TestNotWrittenByFile(t *testing.T) {
	full := reconciler.StatusError(errors.New("policy map is full"))
	other := reconciler.StatusError(errors.New("permission denied"))
	row := func(id uint32, status reconciler.Status, policies ...string) *PolicyEntry {
		return &PolicyEntry{Key: PolicyKey{Identity: identitycell.NumericIdentity(id), Direction: Egress}, Policies: policies, Status: status}
	}
	rows := []*PolicyEntry{
		row(1, full, "a1"),
		row(2, full, "a1", "a2"), // both of a.yaml's: counts once
		row(3, other, "a2", "b1"),
		row(4, reconciler.StatusDone(), "b1"),
		row(5, reconciler.StatusPending(), "b1"),
		row(6, full, "gone"), // no file has it (any more)
	}
	seq := func(yield func(*PolicyEntry, statedb.Revision) bool) {
		for i, r := range rows {
			if !yield(r, statedb.Revision(i)) {
				return
			}
		}
	}
	status := []FileStatus{
		{File: "a.yaml", Policies: []string{"a1", "a2"}},
		{File: "b.yaml", Policies: []string{"b1"}},
		{File: "c.yaml", Policies: []string{"c1"}},
	}
	got := notWrittenByFile(status, seq)
	require.Equal(t, []unwrittenEntries{
		{entries: 3, errors: []string{"permission denied", "policy map is full"}},
		{entries: 1, errors: []string{"permission denied"}},
		{},
	}, got)
	require.Equal(t, "3 policy entries not in the policy map (permission denied; policy map is full)", got[0].String())
	require.Equal(t, "1 policy entry not in the policy map", got[1].count())

	many := unwrittenEntries{entries: 5, errors: []string{"e1", "e2", "e3", "e4", "e5"}}
	require.Equal(t, "5 policy entries not in the policy map (e1; e2; e3; 2 more errors)", many.String())
}
