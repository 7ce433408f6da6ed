package datapathcell

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"golang.org/x/time/rate"

	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// Cell provides the [Datapath]: the pinned BPF maps, the reconcilers that
// make them match the desired tables, and the enforcement program.
var Cell = cell.Module(
	"datapath",
	"Pinned BPF maps and their reconcilers",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(
		func(jobs job.Registry, health cell.Health, log *slog.Logger) job.Group {
			return jobs.NewGroup(health, job.WithLogger(log))
		},
	),
	cell.Provide(newDatapathCell, scriptCommands),
	cell.Invoke(registerIPCacheReconciler, registerPolicyReconcilers),
)

// Config is the datapath's configuration.
type Config struct {
	BPFRoot              string
	Devices              []string
	IPCacheMapMaxEntries uint32
	PolicyMapMaxEntries  uint32
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{
	BPFRoot:              "/sys/fs/bpf",
	IPCacheMapMaxEntries: 512000,
	PolicyMapMaxEntries:  16384,
}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("bpf-root", def.BPFRoot, "bpffs mount for pinned maps and links (mounted if it is not bpffs)")
	flags.StringSlice("devices", def.Devices, "Host-side devices of endpoints to enforce policy on (comma-separated)")
	flags.Uint32("ipcache-map-max-entries", def.IPCacheMapMaxEntries, "Maximum entries of the ipcache map")
	flags.Uint32("policy-map-max-entries", def.PolicyMapMaxEntries, "Maximum entries of the policy map")
}

// Validate reports configuration errors, naming the flag.
func (c Config) Validate() error {
	switch {
	case c.BPFRoot == "":
		return fmt.Errorf("--bpf-root must not be empty")
	case c.IPCacheMapMaxEntries == 0:
		return fmt.Errorf("--ipcache-map-max-entries must be positive")
	case c.PolicyMapMaxEntries == 0:
		return fmt.Errorf("--policy-map-max-entries must be positive")
	}
	for _, d := range c.Devices {
		if d == "" || len(d) > 15 {
			return fmt.Errorf("--devices: %q is not a network device name", d)
		}
	}
	return nil
}

func newDatapathCell(cfg Config, log *slog.Logger, lc cell.Lifecycle) *Datapath {
	d := newDatapath(cfg, log)
	lc.Append(d)
	return d
}

// reconcilerRoundSize is the most objects the reconcilers write per round:
// one batch operation and one status write-back transaction each. Larger
// rounds amortize the write-back (BenchmarkReconcilerThroughput: 1000 ->
// 10000 raised throughput markedly) at the cost of a longer write
// transaction on the table.
const reconcilerRoundSize = 10000

// reconcilerOptions are shared by the map reconcilers. Pruning happens once
// the desired table is initialized, then every minute.
func reconcilerOptions(name string) []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithName(name),
		reconciler.WithPruning(time.Minute),
		reconciler.WithRetry(100*time.Millisecond, time.Minute),
		reconciler.WithRoundLimits(reconcilerRoundSize, rate.NewLimiter(1000, 1)),
	}
}

func registerIPCacheReconciler(params reconciler.Params, d *Datapath, entries ipcachecell.ReconcilerTable) error {
	ops := &mapOps[*ipcachecell.Entry, IPCacheKey, IPCacheValue]{
		name:       IPCacheMapName,
		m:          d.ipcacheMap,
		stats:      d.writeStats(IPCacheMapName),
		key:        func(e *ipcachecell.Entry) IPCacheKey { return NewIPCacheKey(e.Prefix) },
		value:      func(e *ipcachecell.Entry) IPCacheValue { return NewIPCacheValue(uint32(e.Identity)) },
		writeOrder: IPCacheKey.compare,
		// The map as the datapath read it at start, before anything
		// wrote to it: at a million entries, reading the map again took
		// a second of the reconciler's first round after a restart.
		readPinned: d.pinnedIPCache,
	}
	_, err := reconciler.Register(params, entries.RWTable,
		(*ipcachecell.Entry).Clone, (*ipcachecell.Entry).SetStatus, (*ipcachecell.Entry).GetStatus,
		ops, ops, reconcilerOptions(IPCacheMapName)...)
	if err != nil {
		return fmt.Errorf("register ipcache reconciler: %w", err)
	}
	return nil
}
