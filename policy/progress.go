// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"context"

	"github.com/cilium/statedb"
)

// Computed is how far the selectors have computed the desired `policy` and
// `policy-enforcement` tables.
type Computed struct {
	// Policies and Identities are the revisions of the `policies` and
	// `identities` tables that the two tables reflect.
	Policies, Identities statedb.Revision
	// Endpoints is the revision of the `endpoints` table that the two
	// tables reflect: the subjects (the identities of local endpoints)
	// whose entries and enforcement rows they hold. 0 in a hive without
	// the table.
	Endpoints statedb.Revision
	// Entries and Enforcement are revisions of the `policy` and
	// `policy-enforcement` tables at which they reflect them.
	Entries, Enforcement statedb.Revision
	// Selectors is the number of CIDR selectors of the policies in force.
	// Without any, an identity has no policy entries whatever its labels.
	Selectors int
}

// Progress tells how far the policy cell's selectors have computed the
// `policy` and `policy-enforcement` tables. The datapath waits on it to
// write an ipcache entry only after the policy entries of its identity,
// and an `endpoints` map entry only after the policy entries and
// enforcement rows of its subject (make before break:
// datapathcell/README.md): the `identities` and `endpoints` tables
// change before the selectors have turned the change into entries.
type Progress interface {
	// WaitComputed blocks until the policy tables reflect the `policies`,
	// `identities` and (in a hive that has it) `endpoints` tables as txn
	// has them, and returns how far they are computed: every policy entry
	// and enforcement row that follows from txn's policies, identities and
	// local endpoints (their identities are the subjects) is in the
	// `policy` and `policy-enforcement` tables by the returned Entries
	// and Enforcement revisions.
	//
	// Possible errors: ctx's.
	WaitComputed(ctx context.Context, txn statedb.ReadTxn) (Computed, error)
}
