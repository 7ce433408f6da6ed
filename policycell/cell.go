// SPDX-License-Identifier: Apache-2.0

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

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Cell provides the read-only `policies`, `policy`, `policy-enforcement`
// and `dns-rules` tables, the reconciler wrappers of the two policy map
// tables for the datapath, and the policy shell commands. It runs the directory job (when
// --policy-dir is set) and the selector job.
var Cell = cell.Module(
	"policy",
	"CIDR policies from files and the desired policy map",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(
		newPoliciesTable,
		policy.NewEntryTable,
		policy.NewEnforcementTable,
		policy.NewDNSRulesTable,
		newConfiguredLoader,
		newSelectorEngineOf,
		// One job group for the module's jobs.
		func(jobs job.Registry, health cell.Health, log *slog.Logger) job.Group {
			return jobs.NewGroup(health, job.WithLogger(log))
		},
	),
	cell.Provide(
		statedb.RWTable[*policy.Policy].ToTable,
		statedb.RWTable[*policy.Entry].ToTable,
		statedb.RWTable[*policy.Enforcement].ToTable,
		statedb.RWTable[*policy.DNSRules].ToTable,
		func(t statedb.RWTable[*policy.Entry]) policy.ReconcilerTable {
			return policy.ReconcilerTable{RWTable: t}
		},
		func(t statedb.RWTable[*policy.Enforcement]) policy.EnforcementReconcilerTable {
			return policy.EnforcementReconcilerTable{RWTable: t}
		},
		scriptCommands,
		newSelectorProgressOf,
		func(p *SelectorProgress) policy.Progress { return p },
		newPolicyFiles,
		stateFile,
		newMetrics,
	),
	// The jobs run even when no cell asks for what they produce.
	cell.Invoke(registerJobs),
)

// Config is the policy cell's configuration.
type Config struct {
	// PolicyDir holds the policy files. Empty: no policies.
	PolicyDir string
	// EnablePolicy is --enable-policy: EnablePolicyDefault,
	// EnablePolicyAlways or EnablePolicyNever.
	EnablePolicy string
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{PolicyDir: "", EnablePolicy: EnablePolicyDefault}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("policy-dir", def.PolicyDir,
		"Directory of CIDR policy files (*.yaml, *.yml), watched for changes; empty for no policies")
	flags.String("enable-policy", def.EnablePolicy,
		"Policy enforcement mode, as Cilium's: default (a direction is enforced when policies have rules in it), "+
			"always (both directions default deny, even without policies), never (nothing enforced; policies are still read and the policy map kept)")
}

// Validate reports a --policy-dir that exists and is not a directory: it
// can never hold policy files, so it is bad configuration (exit 2), found
// before anything starts. It runs as an Invoke (for `hive` too), where
// nothing may change the disk: a stat changes nothing. One that does not
// exist (yet) is fine: the directory job waits for it.
//
// A bad --enable-policy is bad configuration too.
//
// Possible errors: --policy-dir is not a directory (wrapping
// syscall.ENOTDIR); ErrBadEnablePolicy (wrapped).
func (c Config) Validate() error {
	switch c.EnablePolicy {
	case EnablePolicyDefault, EnablePolicyAlways, EnablePolicyNever:
	default:
		return fmt.Errorf("--enable-policy %q: %w", c.EnablePolicy, ErrBadEnablePolicy)
	}
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
	Policies statedb.RWTable[*policy.Policy]
	IPCache  *ipcachecell.IPCache
	Log      *slog.Logger
	StateDir statedir.Config
	// Capacity is the datapath's --policy-map-max-entries.
	Capacity policy.MapCapacity `optional:"true"`
	// FQDN is provided by the DNS proxy's cell, if the hive has one:
	// without, files with toFQDNs or DNS rules are rejected.
	FQDN *policy.FQDNEnforcer `optional:"true"`
}

// maxEntries returns the policy map's size: the datapath's, else its
// default.
func maxEntries(c policy.MapCapacity) int {
	if c == 0 {
		return DefaultPolicyMapMaxEntries
	}
	return int(c)
}

// newConfiguredLoader returns the loader of --policy-dir, saving the
// versions in force in --state-dir (they survive a restart), and
// rejecting files over the policy map's size.
func newConfiguredLoader(p loaderParams) *loader {
	l := newLoader(p.Config.PolicyDir, p.DB, p.Policies, p.IPCache, p.Log, nil)
	l.maxEntries = maxEntries(p.Capacity)
	if p.FQDN != nil {
		l.fqdnEnforced = true
		p.Log.Info("toFQDNs and DNS rules are enforced", "by", p.FQDN.Name)
	}
	if p.Config.PolicyDir != "" {
		l.saveInForceIn(p.StateDir.StateDir)
	}
	return l
}

// stateFile declares the saved policies in force, which the cell keeps in
// the state directory.
func stateFile() statedir.FileOut {
	return statedir.FileOut{File: statedir.File{Name: InForceFileName, Description: "saved policies in force"}}
}

type selectorParams struct {
	cell.In

	Config      Config
	DB          *statedb.DB
	Policies    statedb.Table[*policy.Policy]
	Identities  statedb.Table[*identitycell.Identity]
	IPCache     statedb.Table[*ipcachecell.Entry]
	Entries     statedb.RWTable[*policy.Entry]
	Enforcement statedb.RWTable[*policy.Enforcement]
	DNSRules    statedb.RWTable[*policy.DNSRules]
	Progress    *SelectorProgress
	Log         *slog.Logger
	// Capacity is the datapath's --policy-map-max-entries.
	Capacity policy.MapCapacity `optional:"true"`
	// Endpoints is the endpoint cell's table, if the hive has one:
	// without, the host-wide default is the only subject.
	Endpoints statedb.Table[*endpoint.State] `optional:"true"`
}

// newSelectorEngineOf returns the selector engine over the cell's tables,
// its table bounded by the policy map's size.
func newSelectorEngineOf(p selectorParams) *selectorEngine {
	e := newSelectorEngine(p.DB, p.Policies, p.Identities, p.IPCache, p.Entries, p.Enforcement, p.Progress, p.Log,
		p.Config.EnablePolicy)
	e.maxEntries = entryBound * maxEntries(p.Capacity)
	e.endpoints = p.Endpoints
	e.writeDNSRulesTo(p.DNSRules)
	return e
}

type jobsParams struct {
	cell.In

	Config    Config
	DB        *statedb.DB
	Policies  statedb.RWTable[*policy.Policy]
	IPCache   *ipcachecell.IPCache
	Loader    *loader
	Selectors *selectorEngine
	Group     job.Group
}

// registerJobs adds the selector job and, with --policy-dir, the directory
// job, registering the directory as an ipcache producer and an initializer
// of the `policies` table, both done once the first complete read is
// applied. Without --policy-dir there is nothing to wait for: neither is
// registered and no directory job runs.
func registerJobs(p jobsParams) {
	if p.Config.PolicyDir != "" {
		producerDone := p.IPCache.RegisterProducer("policy-directory")
		txn := p.DB.WriteTxn(p.Policies)
		markPolicies := p.Policies.RegisterInitializer(txn, "policy-directory")
		txn.Commit()
		p.Loader.initialized = func() {
			txn := p.DB.WriteTxn(p.Policies)
			markPolicies(txn)
			txn.Commit()
			producerDone()
		}
		timing := defaultWatchTiming()
		p.Group.Add(job.OneShot("policy-directory", func(ctx context.Context, health cell.Health) error {
			return p.Loader.watchDirectory(ctx, health, timing)
		}))
	}
	p.Group.Add(job.OneShot("policy-selectors", p.Selectors.run))
}

type scriptParams struct {
	cell.In

	Config      Config
	DB          *statedb.DB
	Loader      *loader
	Policies    statedb.Table[*policy.Policy]
	Entries     statedb.Table[*policy.Entry]
	Enforcement statedb.Table[*policy.Enforcement]
	IPCache     statedb.Table[*ipcachecell.Entry]
	Identities  statedb.Table[*identitycell.Identity]
	// Datapath is provided by the datapath cell, if the hive has one.
	Datapath policy.Datapath `optional:"true"`
	// Endpoints is the endpoint cell's table, if the hive has one.
	Endpoints statedb.Table[*endpoint.State] `optional:"true"`
}

func scriptCommands(p scriptParams) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(newScriptCommands(p.DB, p.Loader, p.Policies, p.Entries, p.Enforcement, p.IPCache,
		p.Identities, p.Endpoints, p.Datapath, p.Config.EnablePolicy))
}
