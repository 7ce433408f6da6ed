// SPDX-License-Identifier: Apache-2.0

package restorecell

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// Cell provides the [Restorer] and the `restore/status` shell command.
var Cell = cell.Module(
	"restore",
	"Restore of identity numbers after a restart",

	cell.Config(DefaultConfig),
	cell.Provide(newRestorer, statusCommand, newMetrics),
	cell.Invoke(Config.Validate, registerRestorer),
)

// Config is the restore cell's configuration.
type Config struct {
	// IdentityRestoreGracePeriod is how long restored prefixes keep their
	// identities while their real owners re-assert them, counted from the
	// moment restore has spoken (the pinned map restored, soon after start).
	IdentityRestoreGracePeriod time.Duration
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{IdentityRestoreGracePeriod: 10 * time.Minute}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Duration("identity-restore-grace-period", def.IdentityRestoreGracePeriod,
		"How long prefixes restored after a restart keep their identities while their owners re-assert them")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: one naming --identity-restore-grace-period when it is
// negative.
func (c Config) Validate() error {
	if c.IdentityRestoreGracePeriod < 0 {
		return fmt.Errorf("--identity-restore-grace-period must not be negative, got %s", c.IdentityRestoreGracePeriod)
	}
	return nil
}

type restorerParams struct {
	cell.In

	Config       Config
	Log          *slog.Logger
	DB           *statedb.DB
	Metadata     statedb.Table[*ipcachecell.PrefixMetadata]
	Entries      statedb.Table[*ipcachecell.Entry]
	Checkpointer *identitycell.Checkpointer
	Allocator    *identitycell.Allocator
	IPCache      *ipcachecell.IPCache
}

func newRestorer(p restorerParams) *Restorer {
	return &Restorer{
		cfg:        p.Config,
		log:        p.Log,
		db:         p.DB,
		metadata:   p.Metadata,
		entries:    p.Entries,
		checkpoint: p.Checkpointer,
		allocator:  p.Allocator,
		ipcache:    p.IPCache,
		restoredCh: make(chan struct{}),
	}
}

// registerRestorer registers what the module runs: restore as a producer
// that holds the allocator's local space until it has withheld every
// number it restores, as the reader of the pinned ipcache map's read, its
// start hook, and its jobs in the module's one job group.
//
// The start hook runs after the Checkpointer's, whose output it waits
// for, by their dependency, not by the order of the cells: the
// Checkpointer appends its start hook when it is constructed, and the hive
// constructs it before this Invoke, which takes the Restorer built over
// it, can run. The jobs start after the start hook (the group appends
// them after it). restorePinned is a job, not part of the start hook, so
// that the owners' upserts and their resolution overlap the kernel's read
// of the pinned map (docs/SCALE.md, "The restart overlaps restore"); a
// map that cannot be read stops the agent (job.WithShutdown).
func registerRestorer(r *Restorer, pinned bpfmaps.PinnedIPCache, lc cell.Lifecycle, jobs job.Registry, health cell.Health) {
	r.pinned = pinned
	r.restorerDone = r.ipcache.RegisterProducer(Resource)
	r.releaseLocal = r.allocator.HoldLocal()
	lc.Append(r)
	group := jobs.NewGroup(health, job.WithLogger(r.log))
	group.Add(
		job.OneShot("restore-pinned-prefixes", r.restorePinned, job.WithShutdown()),
		job.OneShot("write-orphaned-prefixes", r.writeOrphans, job.WithShutdown()),
		job.OneShot("release-after-grace-period", r.releaseAfterGracePeriod))
}

func statusCommand(r *Restorer) hive.ScriptCmdOut {
	return hive.NewScriptCmd("restore/status", scriptcmd.Show(
		script.CmdUsage{
			Summary: "Show the restore: prefixes restored, still held only by restore, time left",
			Detail: []string{
				"Restoring is true from the start until the pinned map's prefixes",
				"are restored; the grace period starts then.",
				"-o json: one object (restoring, restored, heldOnlyByRestore,",
				"withheld, timeLeftSeconds, releasing, released).",
			},
		},
		func(s *script.State, asJSON bool) (script.WaitFunc, error) {
			st := r.Status()
			if asJSON {
				return scriptcmd.JSON(statusJSON{
					Restoring: st.Restoring, Restored: st.Restored, HeldOnlyByRestore: st.HeldOnlyByRestore, Withheld: st.Withheld,
					TimeLeftSeconds: st.TimeLeft.Round(time.Millisecond).Seconds(),
					Releasing:       st.Releasing, Released: st.Released,
				}, nil)
			}
			out := fmt.Sprintf("Restoring: %t\nRestored: %d\nHeld only by restore: %d\nWithheld numbers: %d\nTime left: %s\nReleasing: %t\nReleased: %t\n",
				st.Restoring, st.Restored, st.HeldOnlyByRestore, st.Withheld, st.TimeLeft.Round(time.Millisecond), st.Releasing, st.Released)
			return scriptcmd.Result(out, nil)
		}))
}

// statusJSON is restore/status -o json.
type statusJSON struct {
	Restoring         bool    `json:"restoring"`
	Restored          int     `json:"restored"`
	HeldOnlyByRestore int     `json:"heldOnlyByRestore"`
	Withheld          int     `json:"withheld"`
	TimeLeftSeconds   float64 `json:"timeLeftSeconds"`
	Releasing         bool    `json:"releasing"`
	Released          bool    `json:"released"`
}
