package policycell

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"syscall"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// Cell provides the read-only `policies`, `policy` and
// `policy-enforcement` tables, their reconciler wrappers for the datapath,
// and the policy shell commands. It runs the directory job (when
// --policy-dir is set) and the selector job.
var Cell = cell.Module(
	"policy",
	"CIDR policies from files and the desired policy map",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(
		NewPoliciesTable,
		NewPolicyTable,
		NewEnforcementTable,
		newLoaderCell,
	),
	cell.Provide(
		statedb.RWTable[*Policy].ToTable,
		statedb.RWTable[*PolicyEntry].ToTable,
		statedb.RWTable[*Enforcement].ToTable,
		func(t statedb.RWTable[*PolicyEntry]) PolicyReconcilerTable { return PolicyReconcilerTable{t} },
		func(t statedb.RWTable[*Enforcement]) EnforcementReconcilerTable { return EnforcementReconcilerTable{t} },
		scriptCommands,
		newSelectorProgress,
	),
	// The jobs run even when no cell asks for what they produce.
	cell.Invoke(func(*loader) {}),
	cell.Invoke(registerSelectorEngine),
)

// Config is the policy cell's configuration.
type Config struct {
	// PolicyDir holds the policy files. Empty: no policies.
	PolicyDir string
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{PolicyDir: ""}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("policy-dir", def.PolicyDir,
		"Directory of CIDR policy files (*.yaml, *.yml), watched for changes; empty for no policies")
}

// Validate reports a --policy-dir that exists and is not a directory: it
// can never hold policy files, so it is bad configuration (exit 2), found
// before anything starts. It runs as an Invoke (for `hive` too), where
// nothing may change the disk: a stat changes nothing. One that does not
// exist (yet) is fine: the directory job waits for it.
func (c Config) Validate() error {
	if c.PolicyDir == "" {
		return nil
	}
	info, err := os.Stat(c.PolicyDir)
	if err != nil || info.IsDir() {
		return nil
	}
	return fmt.Errorf("--policy-dir %s: %w", c.PolicyDir, syscall.ENOTDIR)
}

type loaderParams struct {
	cell.In

	Config   Config
	DB       *statedb.DB
	Policies statedb.RWTable[*Policy]
	IPCache  *ipcachecell.IPCache
	Log      *slog.Logger
	Jobs     job.Registry
	Health   cell.Health
	Identity identitycell.Config // for --state-dir
}

// newLoaderCell registers the policy directory as an ipcache producer and
// an initializer of the `policies` table, both done once the first
// complete read is applied. Without --policy-dir there is nothing to
// wait for: neither is registered and no job runs.
func newLoaderCell(p loaderParams) *loader {
	if p.Config.PolicyDir == "" {
		return newLoader("", p.DB, p.Policies, p.IPCache, p.Log, nil)
	}
	producerDone := p.IPCache.RegisterProducer("policy-directory")
	txn := p.DB.WriteTxn(p.Policies)
	markPolicies := p.Policies.RegisterInitializer(txn, "policy-directory")
	txn.Commit()
	initialized := func() {
		txn := p.DB.WriteTxn(p.Policies)
		markPolicies(txn)
		txn.Commit()
		producerDone()
	}
	l := newLoader(p.Config.PolicyDir, p.DB, p.Policies, p.IPCache, p.Log, initialized)
	l.saveInForceIn(p.Identity.StateDir) // the versions in force survive a restart
	group := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	timing := defaultWatchTiming()
	group.Add(job.OneShot("policy-directory", func(ctx context.Context, health cell.Health) error {
		return l.watchDirectory(ctx, health, timing)
	}))
	return l
}

type selectorParams struct {
	cell.In

	DB          *statedb.DB
	Policies    statedb.Table[*Policy]
	Identities  statedb.Table[*identitycell.Identity]
	IPCache     statedb.Table[*ipcachecell.Entry]
	Entries     statedb.RWTable[*PolicyEntry]
	Enforcement statedb.RWTable[*Enforcement]
	Progress    *SelectorProgress
	Log         *slog.Logger
	Jobs        job.Registry
	Health      cell.Health
}

func registerSelectorEngine(p selectorParams) {
	e := newSelectorEngine(p.DB, p.Policies, p.Identities, p.IPCache, p.Entries, p.Enforcement, p.Progress, p.Log)
	group := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	group.Add(job.OneShot("policy-selectors", e.run))
}

type scriptParams struct {
	cell.In

	DB          *statedb.DB
	Loader      *loader
	Policies    statedb.Table[*Policy]
	Entries     statedb.Table[*PolicyEntry]
	Enforcement statedb.Table[*Enforcement]
	IPCache     statedb.Table[*ipcachecell.Entry]
	Identities  statedb.Table[*identitycell.Identity]
	// Datapath is provided by the datapath cell, if the hive has one.
	Datapath DatapathMaps `optional:"true"`
}

func scriptCommands(p scriptParams) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(newScriptCommands(p.DB, p.Loader, p.Policies, p.Entries, p.Enforcement, p.IPCache,
		p.Identities, p.Datapath))
}
