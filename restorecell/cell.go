package restorecell

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// Cell provides the [Restorer] and the `restore/status` shell command.
var Cell = cell.Module(
	"restore",
	"Restore of identity numbers after a restart",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.Provide(newRestorerCell, statusCommand),
	cell.Invoke(func(*Restorer) {}),
)

// Config is the restore cell's configuration.
type Config struct {
	// IdentityRestoreGracePeriod is how long restored prefixes keep their
	// identities while their real owners re-assert them, counted from the
	// moment restore has spoken (right after start).
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
	Datapath     *datapathcell.Datapath
	Checkpointer *identitycell.Checkpointer
	Allocator    *identitycell.Allocator
	IPCache      *ipcachecell.IPCache
	Lifecycle    cell.Lifecycle
	Jobs         job.Registry
	Health       cell.Health
}

func newRestorerCell(p restorerParams) *Restorer {
	r := &Restorer{
		cfg:          p.Config,
		log:          p.Log,
		db:           p.DB,
		metadata:     p.Metadata,
		entries:      p.Entries,
		pinned:       p.Datapath,
		checkpoint:   p.Checkpointer,
		allocator:    p.Allocator,
		ipcache:      p.IPCache,
		restorerDone: p.IPCache.RegisterProducer(Resource, ipcachecell.HoldsResolution()),
		identityDone: p.Allocator.RegisterInitializer(Resource),
	}
	p.Lifecycle.Append(r)
	group := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	group.Add(
		job.OneShot("release-after-grace-period", r.releaseAfterGracePeriod),
		job.OneShot("mark-identities-initialized", func(ctx context.Context, _ cell.Health) error {
			r.markIdentitiesInitialized(ctx, p.Entries)
			return nil
		}),
	)
	return r
}

func statusCommand(r *Restorer) hive.ScriptCmdOut {
	return hive.NewScriptCmd("restore/status", script.Command(
		script.CmdUsage{Summary: "Show the restore: prefixes restored, still held only by restore, time left"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			st := r.Status()
			out := fmt.Sprintf("Restored: %d\nHeld only by restore: %d\nTime left: %s\nReleasing: %t\nReleased: %t\n",
				st.Restored, st.HeldOnlyByRestore, st.TimeLeft.Round(time.Millisecond), st.Releasing, st.Released)
			return scriptcmd.Result(out, nil)
		}))
}
