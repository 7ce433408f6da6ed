// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Cell provides the identity [Allocator] (local and label identities), the
// read-only `identities` table, the [Checkpointer] and the identity/list and
// identity/get shell commands (with the [Users] other cells contribute).
var Cell = cell.Module(
	"identity",
	"Local CIDR identity allocation",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(NewIdentitiesTable),
	cell.Provide(
		statedb.RWTable[*Identity].ToTable,
		newConfiguredAllocator,
		newLifecycleCheckpointer,
		stateFile,
		newMetrics,
		newCommands,
	),
	cell.Invoke(Config.Validate, registerCheckpointer),
)

// Config is the identity cell's configuration.
type Config struct {
	// IdentityLocalSpaceSize limits how many local numbers are handed out
	// (from the start of the local scope). Hidden: it exists so that tests
	// can exhaust the space.
	IdentityLocalSpaceSize uint32

	// IdentityLabelSpaceSize limits how many label identities are handed
	// out (from the start of the cluster range). Hidden, for tests too.
	IdentityLabelSpaceSize uint32
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{
	IdentityLocalSpaceSize: uint32(identity.MaxLocal - identity.MinLocal + 1),
	IdentityLabelSpaceSize: uint32(identity.MaxCluster - identity.MinCluster + 1),
}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint32("identity-local-space-size", def.IdentityLocalSpaceSize,
		"Number of local identities that may be allocated (for tests)")
	_ = flags.MarkHidden("identity-local-space-size")
	flags.Uint32("identity-label-space-size", def.IdentityLabelSpaceSize,
		"Number of label identities that may be allocated (for tests)")
	_ = flags.MarkHidden("identity-label-space-size")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: one naming --identity-local-space-size or
// --identity-label-space-size when it is out of range.
func (c Config) Validate() error {
	if max := uint32(identity.MaxLocal - identity.MinLocal + 1); c.IdentityLocalSpaceSize < 1 || c.IdentityLocalSpaceSize > max {
		return fmt.Errorf("--identity-local-space-size must be in 1..%d, got %d", max, c.IdentityLocalSpaceSize)
	}
	if max := uint32(identity.MaxCluster - identity.MinCluster + 1); c.IdentityLabelSpaceSize < 1 || c.IdentityLabelSpaceSize > max {
		return fmt.Errorf("--identity-label-space-size must be in 1..%d, got %d", max, c.IdentityLabelSpaceSize)
	}
	return nil
}

func newConfiguredAllocator(cfg Config, db *statedb.DB, table statedb.RWTable[*Identity], log *slog.Logger) *Allocator {
	last := identity.MinLocal + identity.Number(cfg.IdentityLocalSpaceSize) - 1
	clusterLast := identity.MinCluster + identity.Number(cfg.IdentityLabelSpaceSize) - 1
	return newAllocator(db, table, log, identity.MinLocal, last, identity.MinCluster, clusterLast)
}

// newLifecycleCheckpointer returns the Checkpointer with its start hook
// (which reads the previous checkpoint) appended to the lifecycle. It is
// appended here, not in the module's Invoke, so that the hive runs it
// before the start hook of anything built over the Checkpointer (restore,
// which reads the checkpoint), whatever the order of the cells: the
// Datapath's constructor does the same.
func newLifecycleCheckpointer(cfg statedir.Config, db *statedb.DB, table statedb.Table[*Identity], log *slog.Logger, lc cell.Lifecycle) *Checkpointer {
	c := newCheckpointer(db, table, log, cfg.StateDir)
	lc.Append(c)
	return c
}

// stateFile declares the checkpoint, which the cell keeps in the state
// directory.
func stateFile() statedir.FileOut {
	return statedir.FileOut{File: statedir.File{Name: CheckpointFileName, Description: "identity checkpoint"}}
}

// registerCheckpointer registers what the module runs, in its one job
// group: the Checkpointer's write loop.
func registerCheckpointer(c *Checkpointer, jobs job.Registry, health cell.Health, log *slog.Logger) {
	group := jobs.NewGroup(health, job.WithLogger(log))
	group.Add(job.OneShot("checkpoint", c.run))
}
