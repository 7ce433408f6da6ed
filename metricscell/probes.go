// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// HealthScopes is what the probes read of the agent's health: the
// agent's infrastructure (package cells) provides it over every module's
// health scopes.
type HealthScopes interface {
	// NotOK returns the scopes whose latest report is neither OK nor
	// Unknown (Degraded, Stopped), sorted by scope.
	NotOK() []ScopeStatus
}

// ScopeStatus is a scope's latest report, as the probes name it.
type ScopeStatus struct {
	Scope   string
	Level   cell.Level
	Message string
}

// The probes' paths on the metrics server, for the manifests that probe
// them (packaging/).
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
)

// probes answers /healthz (liveness) and /readyz (readiness) in plain
// text, 200 or 503, for a DaemonSet's or a systemd unit's probe.
type probes struct {
	db     *statedb.DB
	health HealthScopes // nil in a hive without the agent's infrastructure
}

// healthz is 200 while the agent serves and no scope is Stopped: a
// stopped scope is a job that ended for good, which only a restart
// brings back.
func (p probes) healthz(w http.ResponseWriter, _ *http.Request) {
	if stopped := p.scopes(cell.StatusStopped); len(stopped) > 0 {
		unavailable(w, "stopped: "+strings.Join(stopped, "; "))
		return
	}
	fmt.Fprintln(w, "ok")
}

// readyz is 200 once every table is initialized (the ipcache, the policy
// tables, the endpoints... as the agent logs "... initialized" for each)
// and no scope is Degraded or Stopped.
func (p probes) readyz(w http.ResponseWriter, _ *http.Request) {
	var reasons []string
	if pending := p.pendingTables(); len(pending) > 0 {
		reasons = append(reasons, "tables not initialized: "+strings.Join(pending, ", "))
	}
	if bad := p.scopes(cell.StatusDegraded, cell.StatusStopped); len(bad) > 0 {
		reasons = append(reasons, "not healthy: "+strings.Join(bad, "; "))
	}
	if len(reasons) > 0 {
		unavailable(w, "not ready: "+strings.Join(reasons, "\n"))
		return
	}
	fmt.Fprintln(w, "ready")
}

// scopes returns "<scope> (<level>: <message>)" of the scopes at one of
// levels.
func (p probes) scopes(levels ...cell.Level) []string {
	if p.health == nil {
		return nil
	}
	var names []string
	for _, s := range p.health.NotOK() {
		if slices.Contains(levels, s.Level) {
			names = append(names, fmt.Sprintf("%s (%s: %s)", s.Scope, s.Level, s.Message))
		}
	}
	return names
}

// pendingTables returns the names of the tables not yet initialized,
// sorted.
func (p probes) pendingTables() []string {
	txn := p.db.ReadTxn()
	var pending []string
	for _, tbl := range p.db.GetTables(txn) {
		if done, _ := tbl.Initialized(txn); !done {
			pending = append(pending, tbl.Name())
		}
	}
	slices.Sort(pending)
	return pending
}

func unavailable(w http.ResponseWriter, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, reason)
}
