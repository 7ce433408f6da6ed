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

	cell.ProvidePrivate(NewMetadataTable, NewEntriesTable),
	cell.Provide(
		statedb.RWTable[*PrefixMetadata].ToTable,
		statedb.RWTable[*Entry].ToTable,
		newIPCacheCell,
		scriptCommands,
		func(entries statedb.RWTable[*Entry]) ReconcilerTable { return ReconcilerTable{entries} },
	),
	// The resolver runs even when no cell asks for the IPCache.
	cell.Invoke(func(*IPCache) {}),
)

type ipcacheParams struct {
	cell.In

	DB        *statedb.DB
	Metadata  statedb.RWTable[*PrefixMetadata]
	Entries   statedb.RWTable[*Entry]
	Allocator *identitycell.Allocator
	Log       *slog.Logger
	Jobs      job.Registry
	Health    cell.Health
}

func newIPCacheCell(p ipcacheParams) *IPCache {
	gate := newResolutionGate()
	resolved := progress.New[statedb.Revision](0)
	r := newResolver(p.DB, p.Metadata, p.Entries, p.Allocator, p.Log, gate, resolved)
	group := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	group.Add(job.OneShot("resolve", r.run))
	return newIPCache(p.DB, p.Metadata, gate, resolved)
}

func scriptCommands(db *statedb.DB, metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry],
	identities statedb.Table[*identitycell.Identity]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(newScriptCommands(db, metadata, entries, identities))
}
