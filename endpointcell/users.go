// SPDX-License-Identifier: Apache-2.0

package endpointcell

import (
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
)

// newIdentityUsers contributes the endpoints to the identity commands:
// the endpoints whose label identity an identity is (each holds one
// reference to it).
func newIdentityUsers(endpoints statedb.Table[*endpoint.State]) identitycell.UsersOut {
	return identitycell.UsersOut{Users: []identitycell.Users{
		{Kind: "endpoints", Lookup: func(txn statedb.ReadTxn) func(*identitycell.Identity, int) (int, []string) {
			return func(ident *identitycell.Identity, max int) (int, []string) {
				var (
					count int
					first []string
				)
				for ep := range endpoints.List(txn, endpoint.IdentityIndex.Query(ident.ID)) {
					if count++; len(first) < max {
						first = append(first, ep.ID())
					}
				}
				return count, first
			}
		}},
	}}
}
