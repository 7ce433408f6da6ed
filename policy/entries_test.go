// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"slices"
	"testing"

	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// TestAppendIdentitiesEntries: the entries of a set of identities, by one
// walk or, past the entries of too many other identities, one search
// each, are what a search per identity finds, in the same order.
func TestAppendIdentitiesEntries(t *testing.T) {
	db := statedb.New()
	table, err := NewEntryTable(db)
	require.NoError(t, err)
	txn := db.WriteTxn(table)
	// Identities 10 to 309 have two entries each, of two subjects; the odd
	// ones between 400 and 500 one; the others none.
	for id := identity.Number(10); id < 310; id++ {
		for _, subject := range []identity.Number{0, 300} {
			_, _, err := table.Insert(txn, &Entry{Key: Key{Subject: subject, Identity: id, Direction: Egress}, Policies: []string{"p"}})
			require.NoError(t, err)
		}
	}
	for id := identity.Number(401); id < 500; id += 2 {
		_, _, err := table.Insert(txn, &Entry{Key: Key{Identity: id, Direction: Ingress, Protocol: ProtocolTCP, Port: 80}})
		require.NoError(t, err)
	}
	txn.Commit()

	read := db.ReadTxn()
	oneByOne := func(ids []identity.Number) ([]*Entry, []int) {
		out, ends := []*Entry{nil}, []int{}
		for _, id := range ids {
			out = slices.AppendSeq(out, IdentityEntries(read, table, id))
			ends = append(ends, len(out))
		}
		return out, ends
	}
	all := func(from, to identity.Number, step int) []identity.Number {
		var ids []identity.Number
		for id := from; id < to; id += identity.Number(step) {
			ids = append(ids, id)
		}
		return ids
	}
	for name, ids := range map[string][]identity.Number{
		"none":                   nil,
		"all":                    all(0, 600, 1),
		"dense":                  all(10, 310, 1),
		"every third":            all(5, 520, 3),
		"spread, walk gives up":  {10, 150, 309, 401, 499},
		"past the end":           {500, 501, 900},
		"before and after":       {1, 2, 9, 310, 311},
		"one with entries":       {200},
		"the odd ones, and more": append(all(401, 500, 2), 700),
	} {
		t.Run(name, func(t *testing.T) {
			wantOut, wantEnds := oneByOne(ids)
			out, ends := AppendIdentitiesEntries(read, table, ids, []*Entry{nil}, []int{})
			require.Equal(t, wantOut, out)
			require.Equal(t, wantEnds, ends)
		})
	}
}
