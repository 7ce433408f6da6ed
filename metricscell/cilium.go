// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/conntrackcell"
	"github.com/ipcache-agent/ipcache-agent/policy"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

// Series a Cilium user looks for, under Cilium's names and labels, from
// what this agent has: the program counts packets and bytes per direction,
// for allowed packets and for each drop reason, which Cilium's reason
// strings name (ciliumDropReason).
const ciliumPrefix = "cilium_"

// ciliumDropReason is Cilium's reason string for a drop reason of the
// program: "Policy denied" for a packet no policy allows, "Invalid packet"
// (Cilium's DROP_INVALID) for a malformed IP header, "Policy denied by
// denylist" (Cilium's DROP_POLICY_DENY) for a packet a deny entry matches,
// "Unsupported L2 protocol" for a VLAN tag in the packet, "Invalid IPv6
// extension header" for a chain past the program's bound; a fragment the
// program cannot place has no Cilium counterpart and keeps its own name.
func ciliumDropReason(r bpfmaps.Reason) string {
	switch r {
	case bpfmaps.ReasonNoPolicy:
		return "Policy denied"
	case bpfmaps.ReasonMalformed:
		return "Invalid packet"
	case bpfmaps.ReasonPolicyDeny:
		return "Policy denied by denylist"
	case bpfmaps.ReasonVLANTagged:
		return "Unsupported L2 protocol"
	case bpfmaps.ReasonExtHeaders:
		return "Invalid IPv6 extension header"
	case bpfmaps.ReasonSpoofedSource:
		return "Invalid source ip"
	}
	return r.String()
}

// ciliumDirection is Cilium's spelling of a direction label.
func ciliumDirection(direction string) string {
	if direction == "ingress" {
		return "INGRESS"
	}
	return "EGRESS"
}

// mapPressureCollector reports cilium_bpf_map_pressure of the ipcache and
// policy maps (entries written over max entries) and the conntrack map
// (live entries of its collector's last pass), and the policies:
// cilium_policy and the files in force and rejected.
type mapPressureCollector struct {
	db       *statedb.DB
	ipcache  statedb.Table[*ipcachecell.Entry]
	policy   statedb.Table[*policy.Entry]
	policies statedb.Table[*policy.Policy]
	files    *policycell.PolicyFiles
	cfg      datapathcell.Config
	datapath *datapathcell.Datapath
	// conntrack is nil without the conntrack cell.
	conntrack *conntrackcell.Tracker

	pressure, policyCount, policyFiles *prometheus.Desc
}

var _ prometheus.Collector = (*mapPressureCollector)(nil)

func newMapPressureCollector(p stateParams) *mapPressureCollector {
	return &mapPressureCollector{
		db: p.DB, ipcache: p.Entries, policy: p.PolicyEntries, policies: p.Policies, files: p.PolicyFiles, cfg: p.DatapathConfig,
		datapath: p.Datapath, conntrack: p.Conntrack,
		pressure: prometheus.NewDesc(ciliumPrefix+"bpf_map_pressure",
			"Fill of a BPF map: entries over max entries (ipcache and policy: the entries the agent has written; conntrack: the live entries of the last collection pass)",
			[]string{"map_name"}, nil),
		policyCount: prometheus.NewDesc(ciliumPrefix+"policy",
			"Policies in force", nil, nil),
		policyFiles: prometheus.NewDesc(metricPrefix+"policy_files",
			"Files of the policy directory by state: in_force, or rejected (the policies of an earlier content stay in force)",
			[]string{"state"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *mapPressureCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pressure
	ch <- c.policyCount
	ch <- c.policyFiles
}

// Collect implements prometheus.Collector. It walks the ipcache and policy
// tables (one read transaction, as the ipcache collector does), counting
// the rows the writers have written (status Done): the entries in the maps
// as the agent knows them, without reading the kernel's maps.
func (c *mapPressureCollector) Collect(ch chan<- prometheus.Metric) {
	txn := c.db.ReadTxn()
	if c.ipcache != nil && c.cfg.IPCacheMapMaxEntries > 0 {
		n := 0
		for _, rev := range c.ipcache.All(txn) {
			if kind, _ := c.datapath.IPCacheStatus(rev); kind == reconciler.StatusKindDone {
				n++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
			float64(n)/float64(c.cfg.IPCacheMapMaxEntries), bpfmaps.IPCacheName)
	}
	if c.policy != nil && c.cfg.PolicyMapMaxEntries > 0 {
		n := 0
		for e := range c.policy.All(txn) {
			if e.Status.Kind == reconciler.StatusKindDone {
				n++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
			float64(n)/float64(c.cfg.PolicyMapMaxEntries), bpfmaps.PolicyName)
	}
	if c.conntrack != nil {
		ct, opening := c.conntrack.Stats()
		if ct.MaxEntries > 0 {
			ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
				float64(ct.Entries)/float64(ct.MaxEntries), bpfmaps.ConntrackName)
		}
		if opening.MaxEntries > 0 {
			ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue,
				float64(opening.Entries)/float64(opening.MaxEntries), bpfmaps.ConntrackOpeningName)
		}
	}
	if c.policies != nil {
		ch <- prometheus.MustNewConstMetric(c.policyCount, prometheus.GaugeValue, float64(c.policies.NumObjects(txn)))
	}
	if c.files != nil {
		inForce, rejected := c.files.Counts()
		ch <- prometheus.MustNewConstMetric(c.policyFiles, prometheus.GaugeValue, float64(inForce), "in_force")
		ch <- prometheus.MustNewConstMetric(c.policyFiles, prometheus.GaugeValue, float64(rejected), "rejected")
	}
}
