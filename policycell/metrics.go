// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// newMetrics contributes the cell's collector to the agent's metrics.
func newMetrics(db *statedb.DB, policies statedb.Table[*policy.Policy], files *PolicyFiles) metrics.Out {
	return metrics.Out{Collectors: []prometheus.Collector{newPolicyCollector(db, policies, files)}}
}

// policyCollector reports the policies: cilium_policy (under Cilium's
// name) and the files of the policy directory in force and rejected.
type policyCollector struct {
	db       *statedb.DB
	policies statedb.Table[*policy.Policy]
	files    *PolicyFiles

	policyCount, policyFiles *prometheus.Desc
}

var _ prometheus.Collector = (*policyCollector)(nil)

func newPolicyCollector(db *statedb.DB, policies statedb.Table[*policy.Policy], files *PolicyFiles) *policyCollector {
	return &policyCollector{
		db: db, policies: policies, files: files,
		policyCount: prometheus.NewDesc(metrics.CiliumPrefix+"policy",
			"Policies in force", nil, nil),
		policyFiles: prometheus.NewDesc(metrics.Prefix+"policy_files",
			"Files of the policy directory by state: in_force, or rejected (the policies of an earlier content stay in force)",
			[]string{"state"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *policyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.policyCount
	ch <- c.policyFiles
}

// Collect implements prometheus.Collector.
func (c *policyCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.policyCount, prometheus.GaugeValue, float64(c.policies.NumObjects(c.db.ReadTxn())))
	inForce, rejected := c.files.Counts()
	ch <- prometheus.MustNewConstMetric(c.policyFiles, prometheus.GaugeValue, float64(inForce), "in_force")
	ch <- prometheus.MustNewConstMetric(c.policyFiles, prometheus.GaugeValue, float64(rejected), "rejected")
}
