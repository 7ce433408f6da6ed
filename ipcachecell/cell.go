// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"log/slog"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
)

// Cell provides the [IPCache] (for handles), the read-only
// `ipcache-metadata` and `ipcache` tables, and the ipcache shell commands.
var Cell = cell.Module(
	"ipcache",
	"Prefix metadata and the desired ipcache",

	cell.ProvidePrivate(NewMetadataTable, NewEntriesTable, newModuleResolver),
	cell.Provide(
		statedb.RWTable[*PrefixMetadata].ToTable,
		statedb.RWTable[*Entry].ToTable,
		newModuleIPCache,
		newReconcilerTable,
		newScriptCmds,
		newMetrics,
		newIdentityUsers,
	),
	// The resolver runs even when no cell asks for the IPCache.
	cell.Invoke(registerJobs),
)

type resolverParams struct {
	cell.In

	DB        *statedb.DB
	Metadata  statedb.RWTable[*PrefixMetadata]
	Entries   statedb.RWTable[*Entry]
	Allocator *identitycell.Allocator
	Log       *slog.Logger
}

// newModuleResolver returns the module's resolver, not yet running, with
// the tracker of its progress.
func newModuleResolver(p resolverParams) *resolver {
	return newResolver(p.DB, p.Metadata, p.Entries, p.Allocator, p.Log,
		progress.New[statedb.Revision](0))
}

// newModuleIPCache returns the IPCache whose handles write the metadata
// that r resolves.
func newModuleIPCache(db *statedb.DB, metadata statedb.RWTable[*PrefixMetadata], r *resolver) *IPCache {
	return newIPCache(db, metadata, r)
}

// newReconcilerTable returns the `ipcache` table for the datapath's
// writer.
func newReconcilerTable(entries statedb.RWTable[*Entry]) ReconcilerTable {
	return ReconcilerTable{entries}
}

// newScriptCmds returns the ipcache shell commands.
func newScriptCmds(db *statedb.DB, metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry],
	identities statedb.Table[*identitycell.Identity]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(newScriptCommands(db, metadata, entries, identities))
}

// registerJobs registers the module's job group: the resolver.
func registerJobs(jobs job.Registry, health cell.Health, log *slog.Logger, r *resolver) {
	group := jobs.NewGroup(health, job.WithLogger(log))
	group.Add(job.OneShot("resolve", r.run))
}
