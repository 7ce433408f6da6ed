// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"net/netip"
	"testing"

	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// TestIdentityUsers: the prefixes of a CIDR identity are found by its
// labels, a label identity's by a pass over the entries; entries of an
// explicit identity hold no identity and are nobody's users.
func TestIdentityUsers(t *testing.T) {
	db := statedb.New()
	require.NoError(t, db.Start())
	t.Cleanup(func() { db.Stop() })
	metadata, err := NewMetadataTable(db)
	require.NoError(t, err)
	entries, err := NewEntriesTable(db)
	require.NoError(t, err)
	txn := db.WriteTxn(entries)
	for _, e := range []*Entry{
		NewEntry(netip.MustParsePrefix("10.0.0.1/32"), 256, 0),
		NewEntry(netip.MustParsePrefix("10.0.0.2/32"), 256, 0),
		func() *Entry {
			e := NewEntry(netip.MustParsePrefix("10.0.0.3/32"), 300, 0)
			e.Explicit = true
			return e
		}(),
		NewEntry(netip.MustParsePrefix("10.1.0.0/16"), identity.MinLocal, 0),
	} {
		_, _, err := entries.Insert(txn, e)
		require.NoError(t, err)
	}
	txn.Commit()

	var prefixes identitycell.Users
	for _, u := range newIdentityUsers(metadata, entries).Users {
		if u.Kind == "prefixes" {
			prefixes = u
		}
	}
	lookup := prefixes.Lookup(db.ReadTxn())
	web, err := labels.Parse("k8s:app=web")
	require.NoError(t, err)
	count, first := lookup(identitycell.NewIdentity(256, web, 2, false), 1)
	require.Equal(t, 2, count)
	require.Equal(t, []string{"10.0.0.1/32"}, first, "at most max names")
	count, _ = lookup(identitycell.NewIdentity(300, web, 1, false), 5)
	require.Zero(t, count, "an explicit identity's entry holds no identity")
	count, first = lookup(identitycell.NewIdentity(identity.MinLocal, labels.ForPrefix(netip.MustParsePrefix("10.1.0.0/16")), 1, false), 5)
	require.Equal(t, 1, count)
	require.Equal(t, []string{"10.1.0.0/16"}, first)
}
