// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"net/netip"
	"slices"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
)

// newIdentityUsers contributes the ipcache's users of identities to the
// identity commands: the prefixes whose entries map to an identity, and
// the resources that own those prefixes (the owners of identity/show).
func newIdentityUsers(metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry]) identitycell.UsersOut {
	return identitycell.UsersOut{Users: []identitycell.Users{
		{Kind: "prefixes", Lookup: func(txn statedb.ReadTxn) func(*identitycell.Identity, int) (int, []string) {
			prefixesOf := newPrefixesOf(txn, entries)
			return func(ident *identitycell.Identity, max int) (int, []string) {
				prefixes := prefixesOf(ident)
				first := make([]string, 0, min(len(prefixes), max))
				for _, prefix := range prefixes[:min(len(prefixes), max)] {
					first = append(first, prefix.String())
				}
				return len(prefixes), first
			}
		}},
		{Kind: "resources", Lookup: func(txn statedb.ReadTxn) func(*identitycell.Identity, int) (int, []string) {
			prefixesOf := newPrefixesOf(txn, entries)
			return func(ident *identitycell.Identity, max int) (int, []string) {
				var (
					owners []string
					rows   []*PrefixMetadata
				)
				for _, prefix := range prefixesOf(ident) {
					rows = appendPrefixRows(rows[:0], txn, metadata, prefix)
					for _, row := range rows {
						if !slices.Contains(owners, row.Resource()) {
							owners = append(owners, row.Resource())
						}
					}
				}
				return len(owners), owners[:min(len(owners), max)]
			}
		}},
	}}
}

// newPrefixesOf returns what tells the prefixes whose entries map to an
// identity (and hold its reference), in address order. A CIDR identity's
// prefixes are named by its cidr labels, each looked up. A label
// identity's are not: they are found in one pass over the entries, made
// at the first label identity asked about, for all of them.
func newPrefixesOf(txn statedb.ReadTxn, entries statedb.Table[*Entry]) func(*identitycell.Identity) []netip.Prefix {
	var byIdentity map[identity.Number][]netip.Prefix
	return func(ident *identitycell.Identity) []netip.Prefix {
		if !ident.ID.IsCluster() {
			var prefixes []netip.Prefix
			for prefix := range ident.Labels.Prefixes() {
				entry, _, found := entries.Get(txn, EntryIndex.Query(prefix))
				if found && !entry.Explicit && entry.Identity == ident.ID {
					prefixes = append(prefixes, prefix)
				}
			}
			return prefixes
		}
		if byIdentity == nil {
			byIdentity = map[identity.Number][]netip.Prefix{}
			for entry := range entries.All(txn) {
				if !entry.Explicit && entry.Identity.IsCluster() {
					byIdentity[entry.Identity] = append(byIdentity[entry.Identity], entry.Prefix())
				}
			}
		}
		return byIdentity[ident.ID]
	}
}
