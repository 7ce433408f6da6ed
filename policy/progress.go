// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"context"

	"github.com/cilium/statedb"
)

// Computed is how far the selectors have computed the desired `policy` and
// `policy-enforcement` tables.
type Computed struct {
	// Policies, Identities and Endpoints are the revisions of the
	// `policies`, `identities` and `endpoints` tables that the two tables
	// reflect (Endpoints 0 in a hive without endpoints).
	Policies, Identities, Endpoints statedb.Revision
	// Entries and Enforcement are revisions of the `policy` and
	// `policy-enforcement` tables at which they reflect them.
	Entries, Enforcement statedb.Revision
	// Selectors is the number of peer selectors of the policies in force:
	// distinct CIDRs, and distinct selectors of peers by label, entity or
	// DNS name (toFQDNs). Without any, an identity has no policy entries
	// whatever its labels.
	Selectors int
}

// Progress tells how far the policy cell's selectors have computed the
// `policy` and `policy-enforcement` tables. The datapath waits on it to
// write an ipcache entry only after the policy entries of its identity
// (make before break: datapathcell/README.md): the `identities` table
// changes before the selectors have turned the change into entries.
type Progress interface {
	// WaitComputed blocks until the policy tables reflect the `policies`,
	// `identities` and `endpoints` tables as txn has them, and returns how
	// far they are computed: every policy entry and enforcement row that
	// follows from txn's policies, identities and endpoints is in the
	// `policy` and `policy-enforcement` tables by the returned Entries and
	// Enforcement revisions.
	//
	// Possible errors: ctx's.
	WaitComputed(ctx context.Context, txn statedb.ReadTxn) (Computed, error)
}
