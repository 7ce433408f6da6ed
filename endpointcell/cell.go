// SPDX-License-Identifier: Apache-2.0

package endpointcell

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/nodecell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Cell provides the endpoint.Registry, the `endpoints` table and the
// endpoint shell commands.
var Cell = cell.Module(
	"endpoint",
	"Endpoints with labels and their label identities and addresses",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(endpoint.NewTable),
	cell.Provide(
		statedb.RWTable[*endpoint.State].ToTable,
		newEndpoints,
		func(e *Endpoints) endpoint.Registry { return e },
		scriptCommands,
		stateFile,
		newIdentityUsers,
	),
	cell.Invoke(registerEndpoints),
)

func stateFile() statedir.FileOut {
	return statedir.FileOut{File: statedir.File{Name: InForceFileName, Description: "saved endpoint files in force"}}
}

// DirectoryOwner is the owner of the endpoints of --endpoint-dir.
const DirectoryOwner = "directory"

// Config is the endpoint cell's configuration.
type Config struct {
	// EndpointDir is the directory of endpoint documents; empty: none.
	EndpointDir string
	// NodeName is this node's name: endpoints of other nodes are in the
	// ipcache only.
	NodeName string
	// EndpointMaxEntries bounds the endpoints registered at once.
	EndpointMaxEntries uint32
}

// DefaultConfig is the configuration on the defaults; NodeName's default
// is the host name, filled in by Flags.
var DefaultConfig = Config{EndpointMaxEntries: 65535}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	nodeName := def.NodeName
	if nodeName == "" {
		nodeName, _ = os.Hostname()
	}
	flags.String("endpoint-dir", def.EndpointDir, "Directory of endpoint documents (Endpoint, Pod, Namespace, Node, List) to read and watch")
	flags.String("node-name", nodeName, "This node's name: endpoints whose node is another one's are remote")
	flags.Uint32("endpoint-max-entries", def.EndpointMaxEntries, "Maximum number of endpoints")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: one naming --node-name or --endpoint-max-entries.
func (c Config) Validate() error {
	if c.NodeName != "" {
		if err := endpoint.ValidateName(c.NodeName, 253); err != nil {
			return fmt.Errorf("--node-name %q: %w", c.NodeName, err)
		}
	}
	if c.EndpointMaxEntries == 0 {
		return fmt.Errorf("--endpoint-max-entries must be positive")
	}
	return nil
}

type endpointsParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Table     statedb.RWTable[*endpoint.State]
	Allocator *identitycell.Allocator
	IPCache   *ipcachecell.IPCache
	Enforced  endpoint.Enforcement `optional:"true"`
}

func newEndpoints(p endpointsParams) *Endpoints {
	return &Endpoints{
		cfg:        p.Config,
		log:        p.Log,
		db:         p.DB,
		table:      p.Table,
		allocator:  p.Allocator,
		ipcache:    p.IPCache,
		enforced:   p.Enforced,
		sources:    make(map[string]*endpointSource),
		namespaces: make(map[string]map[string]string),
	}
}

type registerParams struct {
	cell.In

	Endpoints *Endpoints
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    cell.Health
	StateDir  statedir.Config
	// Nodes takes the addresses of the directory's Node documents, if
	// the hive has the node cell.
	Nodes *nodecell.Nodes `optional:"true"`
}

// registerEndpoints registers the endpoints as a producer of the ipcache
// and of identities, and an initializer of the `endpoints` table, all
// done once every source created before start has said Initialized; with
// --endpoint-dir, the directory's source and the job that reads it.
func registerEndpoints(p registerParams) error {
	e, lc := p.Endpoints, p.Lifecycle
	ipcacheDone := e.ipcache.RegisterProducer("endpoints")
	identitiesDone := e.allocator.RegisterProducer("endpoints")
	txn := e.db.WriteTxn(e.table)
	tableDone := e.table.RegisterInitializer(txn, "endpoints")
	txn.Commit()
	e.initialized = func() {
		txn := e.allocator.WriteTxn(e.table)
		tableDone(txn)
		identitiesDone(txn)
		txn.Commit()
		ipcacheDone()
		e.log.Info("Endpoints initialized")
	}
	lc.Append(cell.Hook{OnStart: func(cell.HookContext) error {
		e.start()
		return nil
	}})
	if e.cfg.EndpointDir == "" {
		return nil
	}
	src, err := e.NewSource(DirectoryOwner)
	if err != nil {
		return err
	}
	dir := newDirectory(e.log, e.cfg.EndpointDir, p.StateDir.StateDir, src, e.SetNamespace)
	if p.Nodes != nil {
		dir.setNodes = func(nodes []endpoint.Node) error { return p.Nodes.SetNodes(e.cfg.NodeName, nodes) }
	}
	group := p.Jobs.NewGroup(p.Health, job.WithLogger(e.log))
	group.Add(job.OneShot("endpoint-directory", dir.watch))
	return nil
}
