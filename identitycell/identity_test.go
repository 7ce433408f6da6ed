// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/labels"
)

// The labels index finds a label set's identity, and the identities with a
// cidr prefix inside a CIDR, whichever of their labels names it.
func TestLabelsIndexAndIdentitiesWithin(t *testing.T) {
	db := statedb.New()
	table, err := NewIdentitiesTable(db)
	require.NoError(t, err)
	rows := map[NumericIdentity][]string{
		MinLocalIdentity + 1: {"cidr:10.0.0.0/8"},
		MinLocalIdentity + 2: {"cidr:10.1.0.0/16", "app:a"},
		MinLocalIdentity + 3: {"cidr:10.1.0.0/16"},
		MinLocalIdentity + 4: {"cidr:11.0.0.0/8", "cidr:10.2.0.1/32"}, // found through its second prefix
		MinLocalIdentity + 5: {"app:no-cidr"},
		MinLocalIdentity + 6: {"cidr:10.0.0.0/7"}, // same address as 10.0.0.0/8, shorter
		MinLocalIdentity + 7: {"cidr:2001:db8::/32"},
		MinLocalIdentity + 8: {"cidr:::ffff:10.0.0.0/104"}, // IPv6, whatever its bytes
	}
	txn := db.WriteTxn(table)
	for id, lbls := range rows {
		l, err := labels.New(lbls...)
		require.NoError(t, err)
		_, _, err = table.Insert(txn, &Identity{ID: id, Labels: l, References: 1})
		require.NoError(t, err)
	}
	txn.Commit()

	rtxn := db.ReadTxn()
	for id, lbls := range rows {
		l, _ := labels.New(lbls...)
		found, _, ok := table.Get(rtxn, LabelsIndex.Query(l))
		require.True(t, ok, "%v", lbls)
		require.Equal(t, id, found.ID)
	}
	_, _, ok := table.Get(rtxn, LabelsIndex.Query(labels.ForPrefix(netip.MustParsePrefix("10.3.0.0/16"))))
	require.False(t, ok)

	within := func(cidr string) []NumericIdentity {
		var ids []NumericIdentity
		for identity := range IdentitiesWithin(rtxn, table, netip.MustParsePrefix(cidr)) {
			ids = append(ids, identity.ID)
		}
		slices.Sort(ids)
		return slices.Compact(ids)
	}
	require.Equal(t, []NumericIdentity{MinLocalIdentity + 1, MinLocalIdentity + 2, MinLocalIdentity + 3, MinLocalIdentity + 4},
		within("10.0.0.0/8"))
	require.Equal(t, []NumericIdentity{MinLocalIdentity + 2, MinLocalIdentity + 3}, within("10.1.0.0/16"))
	require.Equal(t, []NumericIdentity{MinLocalIdentity + 4}, within("11.0.0.0/8"))
	require.Empty(t, within("10.3.0.0/16"))
	require.Len(t, within("0.0.0.0/0"), 5, "IPv4 only, without the no-cidr identity")
	require.Equal(t, []NumericIdentity{MinLocalIdentity + 7, MinLocalIdentity + 8}, within("::/0"), "IPv6 only")
}
