// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// Cell provides the [Server] of /metrics and the [reconciler.Metrics] that
// the reconcilers use (as their reconciler.Params.DefaultMetrics).
var Cell = cell.Module(
	"metrics",
	"Prometheus metrics",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(newRegistry),
	cell.Provide(newRegisteredReconcilerMetrics, newConfiguredServer),
	cell.Invoke(registerCollectors),
	// The server is registered even when nobody asks for it; it listens
	// only if --prometheus-serve-addr is set.
	cell.Invoke(registerServer),
)

// Config is the metrics cell's configuration.
type Config struct {
	// PrometheusServeAddr is the TCP address (host:port) to serve /metrics
	// on; empty turns the server off.
	PrometheusServeAddr string
}

// DefaultConfig is the configuration on the defaults: no server.
var DefaultConfig = Config{PrometheusServeAddr: ""}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("prometheus-serve-addr", def.PrometheusServeAddr,
		"Address (host:port) to serve Prometheus metrics on at /metrics; empty: off")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: --prometheus-serve-addr is not host:port.
func (c Config) Validate() error {
	if c.PrometheusServeAddr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.PrometheusServeAddr); err != nil {
		return fmt.Errorf("--prometheus-serve-addr %q is not host:port: %w", c.PrometheusServeAddr, err)
	}
	return nil
}

// newRegistry is the hive's own registry, not the process-global default
// one, so that two hives in one process (tests, an embedding agent) do not
// collide.
func newRegistry() *prometheus.Registry {
	registry := prometheus.NewRegistry()
	registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return registry
}

// newRegisteredReconcilerMetrics returns the reconcilers' metrics, registered
// with the hive's registry.
func newRegisteredReconcilerMetrics(registry *prometheus.Registry) (reconciler.Metrics, error) {
	m := newReconcilerMetrics()
	if err := registry.Register(m); err != nil {
		return nil, fmt.Errorf("register reconciler metrics: %w", err)
	}
	return m, nil
}

// registerCollectors registers the collectors the cells contributed
// (metrics.Out), each of which reads its cell's state at scrape time, and
// the collector of the maps' pressure, if a cell contributed a map.
//
// Possible errors: a collector that the registry refuses (a metric
// described twice, or inconsistently); a map pressure without a name or a
// Fill, or contributed twice.
func registerCollectors(registry *prometheus.Registry, contributed metrics.Collectors) error {
	for _, c := range contributed.Collectors {
		if c == nil {
			continue
		}
		if err := registry.Register(c); err != nil {
			return fmt.Errorf("register metrics collector: %w", err)
		}
	}
	if len(contributed.MapPressure) == 0 {
		return nil
	}
	pressure, err := newMapPressureCollector(contributed.MapPressure)
	if err != nil {
		return err
	}
	if err := registry.Register(pressure); err != nil {
		return fmt.Errorf("register map pressure collector: %w", err)
	}
	return nil
}

// serverParams are the server's inputs; the health scopes come from the
// agent's infrastructure, and a hive without it serves probes that look
// at the tables only.
type serverParams struct {
	cell.In

	Config   Config
	Registry *prometheus.Registry
	DB       *statedb.DB
	Health   HealthScopes `optional:"true"`
	Log      *slog.Logger
}

// newConfiguredServer returns the Server of --prometheus-serve-addr; it
// does not listen until its start hook runs (registerServer).
func newConfiguredServer(p serverParams) *Server {
	return newServer(p.Config.PrometheusServeAddr, p.Registry, probes{db: p.DB, health: p.Health}, p.Log)
}

// registerServer appends the server's start hook and, when an address is
// set, adds its serve job.
func registerServer(cfg Config, s *Server, log *slog.Logger, lc cell.Lifecycle, jobs job.Registry, health cell.Health) {
	// The start hook listens before the serve job starts: jobs added
	// before start run after the hooks appended before them.
	lc.Append(s)
	if cfg.PrometheusServeAddr != "" {
		group := jobs.NewGroup(health, job.WithLogger(log))
		group.Add(job.OneShot("serve", s.serve))
	}
}
