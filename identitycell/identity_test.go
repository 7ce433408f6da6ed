// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// The labels index finds a label set's identity, and the identities with a
// cidr prefix inside a CIDR, whichever of their labels names it.
func TestLabelsIndexAndIdentitiesWithin(t *testing.T) {
	db := statedb.New()
	table, err := NewIdentitiesTable(db)
	require.NoError(t, err)
	rows := map[identity.Number][]string{
		identity.MinLocal + 1: {"cidr:10.0.0.0/8"},
		identity.MinLocal + 2: {"cidr:10.1.0.0/16", "app:a"},
		identity.MinLocal + 3: {"cidr:10.1.0.0/16"},
		identity.MinLocal + 4: {"cidr:11.0.0.0/8", "cidr:10.2.0.1/32"}, // found through its second prefix
		identity.MinLocal + 5: {"app:no-cidr"},
		identity.MinLocal + 6: {"cidr:10.0.0.0/7"}, // same address as 10.0.0.0/8, shorter
		identity.MinLocal + 7: {"cidr:2001:db8::/32"},
		identity.MinLocal + 8: {"cidr:::ffff:10.0.0.0/104"}, // IPv6, whatever its bytes
	}
	txn := db.WriteTxn(table)
	for id, lbls := range rows {
		l, err := labels.New(lbls...)
		require.NoError(t, err)
		_, _, err = table.Insert(txn, NewIdentity(id, l, 1, false))
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

	within := func(cidr string) []identity.Number {
		var ids []identity.Number
		for ident := range IdentitiesWithin(rtxn, table, netip.MustParsePrefix(cidr)) {
			ids = append(ids, ident.ID)
		}
		slices.Sort(ids)
		return slices.Compact(ids)
	}
	require.Equal(t, []identity.Number{identity.MinLocal + 1, identity.MinLocal + 2, identity.MinLocal + 3, identity.MinLocal + 4},
		within("10.0.0.0/8"))
	require.Equal(t, []identity.Number{identity.MinLocal + 2, identity.MinLocal + 3}, within("10.1.0.0/16"))
	require.Equal(t, []identity.Number{identity.MinLocal + 4}, within("11.0.0.0/8"))
	require.Empty(t, within("10.3.0.0/16"))
	require.Len(t, within("0.0.0.0/0"), 5, "IPv4 only, without the no-cidr identity")
	require.Equal(t, []identity.Number{identity.MinLocal + 7, identity.MinLocal + 8}, within("::/0"), "IPv6 only")
}

// A row's JSON and YAML (`db/show -format`, statedb's HTTP API) are those
// of the fields it had before the count and the flag shared a word, and
// decode back to the same row.
func TestRowEncoding(t *testing.T) {
	l, err := labels.Parse("cidr:10.0.5.0/24")
	require.NoError(t, err)
	for _, tc := range []struct {
		row        *Identity
		json, yaml string
	}{{
		row:  NewIdentity(identity.MinLocal+5, l, 3, true),
		json: `{"id":16777222,"references":3,"labels":"cidr:10.0.5.0/24","withheld":true}`,
		yaml: "id: 16777222\nreferences: 3\nlabels: cidr:10.0.5.0/24\nwithheld: true\n",
	}, {
		row:  NewIdentity(identity.MinLocal+5, l, 1, false),
		json: `{"id":16777222,"references":1,"labels":"cidr:10.0.5.0/24"}`,
		yaml: "id: 16777222\nreferences: 1\nlabels: cidr:10.0.5.0/24\n",
	}, {
		row:  NewIdentity(identity.MinLocal+5, labels.Labels{}, 0, true),
		json: `{"id":16777222,"references":0,"labels":"","withheld":true}`,
		yaml: "id: 16777222\nreferences: 0\nlabels: \"\"\nwithheld: true\n",
	}} {
		out, err := json.Marshal(tc.row)
		require.NoError(t, err)
		require.Equal(t, tc.json, string(out))
		var fromJSON Identity
		require.NoError(t, json.Unmarshal(out, &fromJSON))
		require.Equal(t, tc.row, &fromJSON)

		out, err = yaml.Marshal(tc.row)
		require.NoError(t, err)
		require.Equal(t, tc.yaml, string(out))
		var fromYAML Identity
		require.NoError(t, yaml.Unmarshal(out, &fromYAML))
		require.Equal(t, tc.row, &fromYAML)
	}

	var row Identity
	require.ErrorIs(t, json.Unmarshal([]byte(`{"id":16777217,"references":2147483648,"labels":"cidr:10.0.0.0/8"}`), &row),
		ErrTooManyReferences, "a count that would set the withheld bit")
	require.ErrorIs(t, yaml.Unmarshal([]byte("id: 16777217\nreferences: 2147483648\nlabels: cidr:10.0.0.0/8\n"), &row),
		ErrTooManyReferences)
}
