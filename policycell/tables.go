// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/policy"
)

const PoliciesTableName = "policies"

// PolicyNameIndex is the primary index of the `policies` table: the
// policies in force, by name.
var PolicyNameIndex = statedb.Index[*policy.Policy, string]{
	Name: "name",
	FromObject: func(p *policy.Policy) index.KeySet {
		return index.NewKeySet(index.String(p.Name))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// newPoliciesTable creates and registers the `policies` table. Only the
// directory reader writes it.
func newPoliciesTable(db *statedb.DB) (statedb.RWTable[*policy.Policy], error) {
	return statedb.NewTable(db, PoliciesTableName, PolicyNameIndex)
}

var _ statedb.TableWritable = &policy.Policy{}
