// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/cnicell"
	"github.com/ipcache-agent/ipcache-agent/conntrackcell"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/devicecell"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
	"github.com/ipcache-agent/ipcache-agent/fqdncell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/metricscell"
	"github.com/ipcache-agent/ipcache-agent/monitorcell"
	"github.com/ipcache-agent/ipcache-agent/nodecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/restorecell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// EnvPrefix is the prefix of environment variables that set flags: the
// flag's name follows it in upper case with dashes as underscores, e.g.
// IPCACHE_AGENT_STATE_DIR for --state-dir. The hive prepends it verbatim,
// hence the trailing underscore.
const EnvPrefix = "IPCACHE_AGENT_"

// Infrastructure is what the project's cells run on: the state database,
// jobs, health reporting and the state directory (--state-dir), which the
// cells that keep files across restarts share.
var Infrastructure = cell.Group(
	statedb.Cell,
	job.Cell,
	healthCell,
	cell.Config(statedir.DefaultConfig),
)

// ControlPlane is the project's own cells, after the owner lock of their
// state directory and pins (see [AcquireOwner]). The endpoint sources
// (the endpoint cell's directory, the CNI server) come after restore:
// their jobs start after restore's start hook has withheld the previous
// run's label identities for their label sets, so that an endpoint gets
// its number back (restore's pinned map, the CIDR identities, is read by
// a job meanwhile: the allocator's local space is held until it is done).
var ControlPlane = cell.Group(
	ownerCell,
	identitycell.Cell,
	ipcachecell.Cell,
	datapathcell.Cell,
	monitorcell.Cell,
	conntrackcell.Cell,
	restorecell.Cell,
	endpointcell.Cell,
	cnicell.Cell,
	policycell.Cell,
	fqdncell.Cell,
	metricscell.Cell,
	devicecell.Cell,
	nodecell.Cell,
)

// NewHive returns a hive of [Infrastructure] and the given cells: the agent
// runs NewHive(ControlPlane); an embedding agent adds its own cells; a
// cell's tests pass just the cells they exercise.
func NewHive(cells ...cell.Cell) *hive.Hive {
	opts := hive.DefaultOptions()
	opts.EnvPrefix = EnvPrefix
	// Start hooks and invokes faster than this log at debug, not info.
	opts.LogThreshold = 100 * time.Millisecond
	opts.ModuleDecorators = cell.ModuleDecorators{
		// Name each module's database handle after it, so statedb's
		// metrics and lock diagnostics say which module held a table.
		func(db *statedb.DB, id cell.ModuleID) *statedb.DB {
			return db.NewHandle(string(id))
		},
		// Give each module its own health scope.
		func(health cell.Health, id cell.ModuleID) cell.Health {
			return health.NewScope(string(id))
		},
	}
	return hive.NewWithOptions(opts, append([]cell.Cell{Infrastructure}, cells...)...)
}
