// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// reconcilerMetrics records what the statedb reconcilers report, labelled
// by the module that registered the reconciler and the reconciler's name
// (the map it writes, for the datapath's). Unlike the state collectors it
// keeps values: the reconcilers push them.
type reconcilerMetrics struct {
	rounds          *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	errorsTotal     *prometheus.CounterVec
	errorsCurrent   *prometheus.GaugeVec
	prunes          *prometheus.CounterVec
	pruneErrors     *prometheus.CounterVec
	pruneDuration   *prometheus.HistogramVec
	pruneLastFailed *prometheus.GaugeVec
}

var (
	_ reconciler.Metrics   = (*reconcilerMetrics)(nil)
	_ prometheus.Collector = (*reconcilerMetrics)(nil)
)

func newReconcilerMetrics() *reconcilerMetrics {
	return &reconcilerMetrics{
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.Prefix + "reconciler_rounds_total",
			Help: "Incremental reconciliation rounds run",
		}, []string{"module_id", "name"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metrics.Prefix + "reconciler_duration_seconds",
			Help:    "Duration of the incremental reconciliation of a round, by operation (update, delete)",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10), // 100µs .. ~26s
		}, []string{"module_id", "name", "operation"}),
		errorsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.Prefix + "reconciler_errors_total",
			Help: "Objects that failed to reconcile (each failed attempt counts)",
		}, []string{"module_id", "name"}),
		errorsCurrent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metrics.Prefix + "reconciler_errors_current",
			Help: "Objects currently failing to reconcile (pending retry)",
		}, []string{"module_id", "name"}),
		prunes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.Prefix + "reconciler_prunes_total",
			Help: "Prunes run (full comparisons that remove what the desired table no longer holds)",
		}, []string{"module_id", "name"}),
		pruneErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.Prefix + "reconciler_prune_errors_total",
			Help: "Prunes that failed",
		}, []string{"module_id", "name"}),
		pruneDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metrics.Prefix + "reconciler_prune_duration_seconds",
			Help:    "Duration of prunes",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"module_id", "name"}),
		pruneLastFailed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metrics.Prefix + "reconciler_prune_last_failed",
			Help: "1 if the last prune failed, 0 if it succeeded",
		}, []string{"module_id", "name"}),
	}
}

func (m *reconcilerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.rounds, m.duration, m.errorsTotal, m.errorsCurrent,
		m.prunes, m.pruneErrors, m.pruneDuration, m.pruneLastFailed}
}

// Describe implements prometheus.Collector.
func (m *reconcilerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *reconcilerMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// ReconciliationDuration implements reconciler.Metrics.
func (m *reconcilerMetrics) ReconciliationDuration(moduleID cell.FullModuleID, name, operation string, duration time.Duration) {
	m.duration.WithLabelValues(moduleID.String(), name, operation).Observe(duration.Seconds())
}

// ReconciliationErrors implements reconciler.Metrics. The reconciler calls
// it once per incremental round.
func (m *reconcilerMetrics) ReconciliationErrors(moduleID cell.FullModuleID, name string, new, current int) {
	id := moduleID.String()
	m.rounds.WithLabelValues(id, name).Inc()
	m.errorsTotal.WithLabelValues(id, name).Add(float64(new))
	m.errorsCurrent.WithLabelValues(id, name).Set(float64(current))
}

// PruneError implements reconciler.Metrics. The reconciler calls it once
// per prune, with a nil error on success.
func (m *reconcilerMetrics) PruneError(moduleID cell.FullModuleID, name string, err error) {
	id := moduleID.String()
	m.prunes.WithLabelValues(id, name).Inc()
	failed := 0.0
	if err != nil {
		m.pruneErrors.WithLabelValues(id, name).Inc()
		failed = 1
	}
	m.pruneLastFailed.WithLabelValues(id, name).Set(failed)
}

// PruneDuration implements reconciler.Metrics.
func (m *reconcilerMetrics) PruneDuration(moduleID cell.FullModuleID, name string, duration time.Duration) {
	m.pruneDuration.WithLabelValues(moduleID.String(), name).Observe(duration.Seconds())
}
