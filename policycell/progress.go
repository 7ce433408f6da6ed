// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"github.com/ipcache-agent/ipcache-agent/policy"

	"context"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
)

// Computed is how far the selectors have computed the desired `policy` and
// `policy-enforcement` tables.
type Computed struct {
	// Policies and Identities are the revisions of the `policies` and
	// `identities` tables that the two tables reflect.
	Policies, Identities statedb.Revision
	// Entries and Enforcement are revisions of the `policy` and
	// `policy-enforcement` tables at which they reflect them.
	Entries, Enforcement statedb.Revision
	// Selectors is the number of CIDR selectors of the policies in force.
	// Without any, an identity has no policy entries whatever its labels.
	Selectors int
}

// SelectorProgress tells how far the selectors have computed the policy
// tables. The datapath waits on it to write an ipcache entry only after the
// policy entries of its identity (make before break:
// datapathcell/README.md): the `identities`
// table changes before the selectors have turned the change into entries.
type SelectorProgress struct {
	db         *statedb.DB
	policies   statedb.Table[*policy.Policy]
	identities statedb.Table[*identitycell.Identity]
	computed   *progress.Tracker[Computed]
}

func newSelectorProgress(db *statedb.DB, policies statedb.Table[*policy.Policy],
	identities statedb.Table[*identitycell.Identity]) *SelectorProgress {
	return &SelectorProgress{db: db, policies: policies, identities: identities, computed: progress.New(Computed{})}
}

// WaitComputed blocks until the policy tables reflect the `policies` and
// `identities` tables as txn has them, and returns how far they are
// computed: every policy entry and enforcement row that follows from txn's
// policies and identities is in the `policy` and `policy-enforcement`
// tables by the returned Entries and Enforcement revisions.
//
// Possible errors: ctx's.
func (p *SelectorProgress) WaitComputed(ctx context.Context, txn statedb.ReadTxn) (Computed, error) {
	policies, identities := p.policies.Revision(txn), p.identities.Revision(txn)
	return p.computed.Wait(ctx, func(c Computed) bool {
		// Without selectors, identities the selectors have not seen yet
		// have no entries to wait for: with no policy naming a CIDR, the
		// ipcache does not wait for the selectors' round.
		return c.Policies >= policies && (c.Identities >= identities || c.Selectors == 0)
	})
}
