// SPDX-License-Identifier: Apache-2.0

package metricscell_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/metricscell"
)

type probeRow string

func (probeRow) TableHeader() []string { return []string{"Name"} }
func (r probeRow) TableRow() []string  { return []string{string(r)} }

var probeRowIndex = statedb.Index[probeRow, string]{
	Name:       "name",
	FromObject: func(r probeRow) index.KeySet { return index.NewKeySet(index.String(string(r))) },
	FromKey:    index.String,
	Unique:     true,
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestProbes: /healthz is 200 until a scope is Stopped; /readyz is 503
// naming the tables not initialized and the scopes not OK, 200 once
// neither is left; both are plain text.
func TestProbes(t *testing.T) {
	var (
		s          *metricscell.Server
		db         *statedb.DB
		table      statedb.Table[probeRow]
		initialize func(statedb.WriteTxn)
		scope      cell.Health
	)
	h := cells.NewHive(metricscell.Cell,
		cell.Module("probed", "A table and a scope the test drives",
			cell.Invoke(func(d *statedb.DB, health cell.Health, srv *metricscell.Server) error {
				tbl, err := statedb.NewTable(d, "probed-table", probeRowIndex)
				if err != nil {
					return err
				}
				wtxn := d.WriteTxn(tbl)
				initialize = tbl.RegisterInitializer(wtxn, "test")
				wtxn.Commit()
				db, s, table, scope = d, srv, tbl, health.NewScope("job")
				scope.OK("fine")
				return nil
			})))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse([]string{"--prometheus-serve-addr=127.0.0.1:0"}))
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, h.Stop(log, context.Background()))
		}
	})
	addr := s.Addr().String()

	code, body := get(t, addr, "/healthz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ok\n", body)
	code, body = get(t, addr, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Equal(t, "not ready: tables not initialized: probed-table\n", body)

	wtxn := db.WriteTxn(table)
	initialize(wtxn)
	wtxn.Commit()
	code, body = get(t, addr, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ready\n", body)

	scope.Degraded("broken", nil)
	code, body = get(t, addr, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Equal(t, "not ready: not healthy: probed.job (Degraded: broken)\n", body)
	code, _ = get(t, addr, "/healthz")
	require.Equal(t, http.StatusOK, code, "degraded is alive")

	scope.Stopped("gave up")
	code, body = get(t, addr, "/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Equal(t, "stopped: probed.job (Stopped: gave up)\n", body)
	code, _ = get(t, addr, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)

	scope.OK("fine again")
	code, _ = get(t, addr, "/healthz")
	require.Equal(t, http.StatusOK, code)

	stopped = true
	require.NoError(t, h.Stop(log, context.Background()))
	_, err := http.Get("http://" + addr + "/healthz")
	require.Error(t, err, "nothing answers once the agent stopped")
}
