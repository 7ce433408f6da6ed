// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// SelectorProgress is the selectors' [policy.Progress]: how far they have
// turned the `policies` and `identities` tables into the policy tables.
type SelectorProgress struct {
	db         *statedb.DB
	policies   statedb.Table[*policy.Policy]
	identities statedb.Table[*identitycell.Identity]
	// endpoints is nil in a hive without an endpoint cell.
	endpoints statedb.Table[*endpoint.State]
	computed  *progress.Tracker[policy.Computed]
}

type progressParams struct {
	cell.In

	DB         *statedb.DB
	Policies   statedb.Table[*policy.Policy]
	Identities statedb.Table[*identitycell.Identity]
	Endpoints  statedb.Table[*endpoint.State] `optional:"true"`
}

// newSelectorProgressOf returns the progress of the cell's selectors, over
// the `endpoints` table too if the hive has one.
func newSelectorProgressOf(p progressParams) *SelectorProgress {
	progress := newSelectorProgress(p.DB, p.Policies, p.Identities)
	progress.endpoints = p.Endpoints
	return progress
}

func newSelectorProgress(db *statedb.DB, policies statedb.Table[*policy.Policy],
	identities statedb.Table[*identitycell.Identity]) *SelectorProgress {
	return &SelectorProgress{db: db, policies: policies, identities: identities, computed: progress.New(policy.Computed{})}
}

// WaitComputed implements [policy.Progress].
func (p *SelectorProgress) WaitComputed(ctx context.Context, txn statedb.ReadTxn) (policy.Computed, error) {
	policies, identities := p.policies.Revision(txn), p.identities.Revision(txn)
	var endpoints statedb.Revision
	if p.endpoints != nil {
		endpoints = p.endpoints.Revision(txn)
	}
	return p.computed.Wait(ctx, func(c policy.Computed) bool {
		// Without selectors, identities the selectors have not seen yet
		// have no entries to wait for: with no policy naming a CIDR, the
		// ipcache does not wait for the selectors' round. An endpoint's
		// enforcement rows follow from the policies without any.
		return c.Policies >= policies && (c.Identities >= identities || c.Selectors == 0) && c.Endpoints >= endpoints
	})
}
