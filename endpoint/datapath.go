// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"context"

	"github.com/cilium/statedb"
)

// Datapath tells which revision of each local endpoint's `endpoints` row
// is in the kernel maps. The datapath cell provides it (optional: a hive
// without the datapath has none); the endpoint cell's Source.WaitEnforced
// waits on it with the revision its Upsert wrote.
type Datapath interface {
	// WaitWritten blocks until the datapath has written the row of id
	// ("<namespace>/<name>") at revision rev or later, or its deletion:
	// the row's addresses are in the endpoints map, after the policy
	// entries and enforcement of its identity (make before break:
	// datapathcell/README.md). A row of another node's endpoint has
	// nothing to write and is written once the datapath has seen it.
	//
	// Possible errors: ctx's; the error of the row's write while the
	// datapath holds it back (wrapped: too many subjects, a full map),
	// retried meanwhile.
	WaitWritten(ctx context.Context, id string, rev statedb.Revision) error
}
