// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"golang.org/x/time/rate"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/devicecell"
	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
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
	cell.Provide(newLifecycleDatapath, pinnedIPCache, scriptCommands, newConntrackMaps, bpfScriptCommands, newProgramEvents, newDatapathMaps, newMetrics,
		// The policy cell rejects a file that computes more entries than the
		// map holds, and bounds its table by it.
		func(c Config) policy.MapCapacity {
			return policy.MapCapacity(c.PolicyMapMaxEntries)
		},
		// The endpoint cell's WaitEnforced waits on it.
		func(d *Datapath) endpoint.Enforcement { return d },
		// The DNS proxy's cell tells it its port, waits on its ipcache
		// writes and reads the answers it recorded.
		func(d *Datapath) dnsproxy.Datapath { return d }),
	cell.Invoke(registerWriters),
	cell.Invoke(registerDeviceAttacher),
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
	BPFRoot:              bpfmaps.DefaultRoot,
	IPCacheMapMaxEntries: 512000,
	PolicyMapMaxEntries:  16384,
}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("bpf-root", def.BPFRoot, "bpffs mount for pinned maps and links (mounted if it is not bpffs)")
	flags.StringSlice("devices", def.Devices, "Host-side devices of endpoints to enforce policy on (comma-separated; a name ending in + is a prefix: lxc+)")
	flags.Uint32("ipcache-map-max-entries", def.IPCacheMapMaxEntries, "Maximum entries of the ipcache map")
	flags.Uint32("policy-map-max-entries", def.PolicyMapMaxEntries, "Maximum entries of the policy map")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: an empty --bpf-root, a zero --ipcache-map-max-entries or
// --policy-map-max-entries, a --devices entry that is not a device name
// or a prefix of one followed by '+'.
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
		if !validDeviceEntry(d) {
			return fmt.Errorf("--devices: %q is not a network device name or prefix (name+)", d)
		}
	}
	return nil
}

type datapathParams struct {
	cell.In

	Config Config
	// Conntrack is the conntrack cell's (conntrackcell); without that
	// cell the maps get bpfmaps.DefaultConntrackConfig.
	Conntrack bpfmaps.ConntrackConfig `optional:"true"`
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
}

// newLifecycleDatapath returns the Datapath with its start and stop hooks
// appended to the lifecycle.
func newLifecycleDatapath(p datapathParams) *Datapath {
	d := newDatapath(p.Config, p.Log)
	if p.Conntrack != (bpfmaps.ConntrackConfig{}) {
		d.conntrack = p.Conntrack
	}
	p.Lifecycle.Append(d)
	return d
}

// reconcilerRoundSize is the most objects the reconcilers write per round:
// one batch operation and one status write-back transaction each. Larger
// rounds amortize the write-back (docs/SCALE.md) at the cost of a longer
// write transaction on the table.
const reconcilerRoundSize = 10000

// The map writers' other round limits and retry backoff: at most so many
// rounds a second, so that a batch builds up; a failed object is retried
// after minBackoff, then twice as late each time, up to maxBackoff.
const (
	reconcilerRoundRate  = 1000
	reconcilerMinBackoff = 100 * time.Millisecond
	reconcilerMaxBackoff = time.Minute
)

// reconcilerOptions are shared by the statedb reconcilers of the policy
// map. Pruning happens once the desired table is initialized, then every
// minute; the ipcache writer does the same (ipcacheWriter).
func reconcilerOptions(name string) []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithName(name),
		reconciler.WithPruning(time.Minute),
		reconciler.WithRetry(reconcilerMinBackoff, reconcilerMaxBackoff),
		reconciler.WithRoundLimits(reconcilerRoundSize, rate.NewLimiter(reconcilerRoundRate, 1)),
	}
}

type writersParams struct {
	cell.In

	Reconciler  reconciler.Params
	Datapath    *Datapath
	IPCache     ipcachecell.ReconcilerTable
	Policy      policy.ReconcilerTable
	Enforcement policy.EnforcementReconcilerTable
	Selectors   policy.Progress
	Jobs        job.Group
	Log         *slog.Logger
	// Endpoints is the endpoint cell's table; without it the endpoints
	// map stays as it is and no subject but 0 has entries.
	Endpoints statedb.Table[*endpoint.State] `optional:"true"`
	// Devices is the devices cell's: an endpoint's device is resolved
	// there (and again when it comes back with a new ifindex); without
	// it, by name from the kernel.
	Devices statedb.Table[*devicecell.Device] `optional:"true"`
}

// registerWriters registers the writers of the three maps, in the order
// that make before break needs (see ordering): the policy writer, whose
// progress the ipcache writer waits on, then the ipcache writer, then the
// jobs that wait on both.
func registerWriters(p writersParams) error {
	d := p.Datapath
	order := newOrdering(p.Log, p.Selectors, p.IPCache.RWTable, p.Policy.RWTable, p.Enforcement.RWTable)

	pol := newPolicyOps(d.policyMap, d.statsOf(bpfmaps.PolicyName), order, p.Log)
	pol.anyIdentity = d.setAnyIdentityEntries
	pol.db = p.Reconciler.DB
	pol.guard.heldIPCache = order.heldIPCacheIdentities
	pol.guard.ipcacheEntry = desiredIPCacheIdentity(p.IPCache.RWTable)
	var err error
	order.policyWriter, err = reconciler.Register(p.Reconciler, p.Policy.RWTable,
		(*policy.Entry).Clone, (*policy.Entry).SetStatus, (*policy.Entry).GetStatus,
		pol, pol, reconcilerOptions(bpfmaps.PolicyName)...)
	if err != nil {
		return fmt.Errorf("register policy reconciler: %w", err)
	}

	var writer *ipcacheWriter
	ipcache := &mapwrite.Ops[*ipcachecell.Entry, bpfmaps.IPCacheKey, bpfmaps.IPCacheValue]{
		Name:       bpfmaps.IPCacheName,
		Target:     d.ipcacheMap,
		Stats:      d.statsOf(bpfmaps.IPCacheName),
		Log:        p.Log,
		Key:        func(e *ipcachecell.Entry) bpfmaps.IPCacheKey { return bpfmaps.NewIPCacheKey(e.Prefix()) },
		Value:      func(e *ipcachecell.Entry) bpfmaps.IPCacheValue { return bpfmaps.NewIPCacheValue(e.Identity) },
		WriteOrder: bpfmaps.IPCacheKey.Compare,
		// The map as the datapath read it at start, before anything
		// wrote to it: reading the map again would cost the first round
		// after a restart a read of the whole map.
		ReadPinned: d.pinnedIPCache,
		Gate:       order.beforeIPCacheWrite,
		Hold:       order.holdIPCache,
		Fallbacks: func(txn statedb.ReadTxn, k bpfmaps.IPCacheKey, yield func(bpfmaps.IPCacheKey, bpfmaps.IPCacheValue, bool)) {
			prefix, err := k.Prefix()
			if err != nil {
				return
			}
			entry := func(e *ipcachecell.Entry) {
				// The entry's revision says whether it is written (status).
				_, rev, _ := p.IPCache.Get(txn, ipcachecell.EntryIndex.Query(e.Prefix()))
				kind, _ := writer.status(rev)
				yield(bpfmaps.NewIPCacheKey(e.Prefix()), bpfmaps.NewIPCacheValue(e.Identity), kind != reconciler.StatusKindDone)
			}
			if e, found := ipcachecell.LookupCovering(txn, p.IPCache.RWTable, prefix); found {
				entry(e)
			}
			if prefix.Bits() < prefix.Addr().BitLen() {
				for e := range ipcachecell.EntriesWithin(txn, p.IPCache.RWTable, prefix) {
					if e.Prefix() != prefix {
						entry(e)
					}
				}
			}
		},
		Failed:  func(k bpfmaps.IPCacheKey) { order.ipcacheFailed(d.ipcacheMap(), k) },
		Written: order.ipcacheWritten,
	}
	// The ipcache map's writer keeps the entries' status itself
	// (ipcacheWriter); its job has the name of a statedb reconciler's, and
	// so its health.
	writer = newIPCacheWriter(p.Reconciler, p.IPCache.RWTable, ipcache)
	writer.afterRound = pol.Reguard
	p.Reconciler.JobGroup.Add(job.OneShot("reconcile-"+bpfmaps.IPCacheName, writer.run))
	order.ipcacheWriter = writer

	enforcement := &enforcementWriter{
		db: p.Reconciler.DB, table: p.Enforcement.RWTable, target: d.enforcementMap, order: order,
		stats: d.statsOf(bpfmaps.EnforcementName), log: p.Log, failClosed: pol.failClosed,
	}
	p.Jobs.Add(
		job.OneShot("write-enforcement-map", enforcement.run),
		job.OneShot("drain-policy-map", pol.drain),
	)
	d.order, d.policyOps, d.ipcacheWriter = order, pol, writer
	registerEndpointWriters(p, d, pol)
	enforcement.subjectsFailClosed = d.subjects.failClosed
	return nil
}

// maxSubjects bounds the subjects (other than 0) with a policy map of
// their own: every label identity fits in the outer map.
const maxSubjects = int(bpfmaps.PolicySubjects) - 1

// registerEndpointWriters registers the writers of the subjects' policy
// maps (through the policy writer) and, with the `endpoints` table, of the
// endpoints map.
func registerEndpointWriters(p writersParams, d *Datapath, pol *policyOps) {
	subjects := newSubjectPolicies(p.Log, d.statsOf(bpfmaps.PolicyName), d.order, maxSubjects)
	subjects.outer, subjects.create, subjects.pinned = d.policiesMap, d.newSubjectPolicy, d.pinnedSubjectPolicies
	pol.subjects, d.subjects = subjects, subjects
	if p.Endpoints == nil {
		// Nothing points at a subject: the previous run's maps go.
		d.order.uses.setEndpoints(map[identity.Number]int{})
		return
	}
	subjects.hasEndpoints = func(id identity.Number) bool {
		for e := range p.Endpoints.List(p.Reconciler.DB.ReadTxn(), endpoint.IdentityIndex.Query(id)) {
			if e.Local {
				return true
			}
		}
		return false
	}
	d.endpoints = newEndpointWriter(p.Reconciler.DB, p.Endpoints, p.Enforcement.RWTable, d.endpointsMap, d.order, subjects,
		d.statsOf(bpfmaps.EndpointsName), p.Log)
	if p.Devices != nil {
		d.endpoints.followDevices(p.Devices)
	}
	d.endpoints.filter = d.setEndpointFilter
	p.Jobs.Add(job.OneShot("write-endpoints-map", d.endpoints.run))
}
