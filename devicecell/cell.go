// SPDX-License-Identifier: Apache-2.0

package devicecell

import (
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
)

// Cell provides the read-only `devices` table, kept from netlink.
var Cell = cell.Module(
	"devices",
	"Network devices from netlink",

	cell.ProvidePrivate(NewTable),
	cell.Provide(statedb.RWTable[*Device].ToTable),
	cell.Invoke(registerController),
)

type controllerParams struct {
	cell.In

	DB     *statedb.DB
	Table  statedb.RWTable[*Device]
	Jobs   job.Registry
	Health cell.Health
	Log    *slog.Logger
}

// registerController registers the job that keeps the table.
func registerController(p controllerParams) {
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "netlink")
	wtxn.Commit()
	c := &controller{db: p.DB, table: p.Table, log: p.Log, initDone: initDone}
	g := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	g.Add(job.OneShot("follow-devices", c.run))
}
