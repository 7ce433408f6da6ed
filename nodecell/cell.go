// SPDX-License-Identifier: Apache-2.0

package nodecell

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// Cell provides [Nodes], the addresses of this node and of the other
// nodes in the ipcache, and the `node/addresses` shell command.
var Cell = cell.Module(
	"node",
	"Addresses of this node and of other nodes",

	cell.Provide(
		newNodes,
		scriptCommands,
	),
	cell.Invoke(registerHostAddresses),
)

type hostParams struct {
	cell.In

	Nodes   *Nodes
	IPCache *ipcachecell.IPCache
	Jobs    job.Registry
	Health  cell.Health
	Log     *slog.Logger
}

// registerHostAddresses registers the job that follows this node's
// addresses, and makes the ipcache wait for their first listing: without
// it, reconcilers would prune the entries of this node's addresses that a
// previous run wrote, and policies on the host entity would not hold for
// a moment.
func registerHostAddresses(p hostParams) {
	f := &hostFollower{nodes: p.Nodes, log: p.Log, debounce: hostDebounce,
		initDone: p.IPCache.RegisterProducer(HostResource)}
	g := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	g.Add(job.OneShot("follow-host-addresses", f.run))
}
