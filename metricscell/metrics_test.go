// SPDX-License-Identifier: Apache-2.0

package metricscell_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/metricscell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// scrape fetches /metrics from addr and returns each sample by its series,
// as written in the text exposition format (`name{label="value",...}`).
func scrape(t require.TestingT, addr string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	samples := map[string]float64{}
	lines := bufio.NewScanner(strings.NewReader(string(body)))
	for lines.Scan() {
		line := lines.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, "sample line %q", line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, "sample line %q", line)
		samples[line[:i]] = v
	}
	return samples
}

func TestPrivilegedMetricsScrape(t *testing.T) {
	privileged.Test(t)
	// In a network namespace of its own with only loopback up: the node
	// cell's host addresses are then 127.0.0.1 and ::1 (source local),
	// whatever the machine's.
	if !netnstest.InFreshProcessNetns(t, "ipca-metrics", true) {
		return
	}
	const hostAddresses = 2
	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	require.NoError(t, privileged.MountBPFFS(t, bpfRoot))

	var (
		ipcache *ipcachecell.IPCache
		server  *metricscell.Server
	)
	h := cells.NewHive(cells.ControlPlane,
		cell.Invoke(func(c *ipcachecell.IPCache, s *metricscell.Server) { ipcache, server = c, s }))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	// One rejected policy file: no policy in force, so the ipcache holds
	// only the test's prefixes.
	policyDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "bad.yaml"), []byte("name: bad\negress: nope\n"), 0o600))
	require.NoError(t, flags.Parse([]string{
		"--bpf-root=" + bpfRoot, "--state-dir=" + t.TempDir(), "--prometheus-serve-addr=127.0.0.1:0",
		"--policy-dir=" + policyDir, "--ipcache-map-max-entries=1000",
	}))
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	require.NotNil(t, server.Addr(), "server listens once started")
	addr := server.Addr().String()

	web, err := labels.New("k8s:app=web")
	require.NoError(t, err)
	local, err := ipcache.NewHandle("metrics-test-local", source.Local)
	require.NoError(t, err)
	kube, err := ipcache.NewHandle("metrics-test-k8s", source.Kubernetes)
	require.NoError(t, err)
	for _, p := range []string{"10.1.0.0/16", "10.2.0.0/16", "2001:db8:1::/48"} {
		require.NoError(t, local.Upsert(netip.MustParsePrefix(p), ipcachecell.Metadata{Labels: web}))
	}
	for _, p := range []string{"192.0.2.0/24", "198.51.100.0/24"} {
		require.NoError(t, kube.Upsert(netip.MustParsePrefix(p), ipcachecell.Metadata{Labels: web}))
	}
	// Plus one prefix with an identity allocated elsewhere: an ipcache
	// entry, but no local identity.
	require.NoError(t, kube.Upsert(netip.MustParsePrefix("203.0.113.0/24"), ipcachecell.Metadata{ExplicitIdentity: 5000}))

	const ipcacheRound = `{module_id="datapath",name="ipcache"}`
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := scrape(c, addr)
		// The map writes come last: once the reconciler has written all six
		// prefixes, the rest must hold.
		assert.Equal(c, 6.0+hostAddresses, s[`ipcache_agent_map_writes_total{map="ipcache"}`], "ipcache map writes")
		assert.Equal(c, 0.0, s[`ipcache_agent_reconciler_errors_current`+ipcacheRound], "current reconciliation errors")
		// The policy directory is read by a job of its own, maybe later.
		assert.Equal(c, 1.0, s[`ipcache_agent_policy_files{state="rejected"}`], "rejected policy files")
	}, 10*time.Second, 20*time.Millisecond)

	s := scrape(t, addr)
	for series, want := range map[string]float64{
		`ipcache_agent_ipcache_entries{source="local"}`: 3 + hostAddresses,
		`ipcache_agent_ipcache_entries{source="k8s"}`:   3,
		// Each prefix's label set includes its own cidr label, so each
		// labelled prefix has an identity of its own.
		`ipcache_agent_identities{state="allocated"}`:                                 5 + hostAddresses,
		`ipcache_agent_identities{state="withheld"}`:                                  0,
		`ipcache_agent_restore_restored_prefixes`:                                     0,
		`ipcache_agent_restore_held_only_by_restore_prefixes`:                         0,
		`ipcache_agent_map_writes_unchanged_total{map="ipcache"}`:                     0,
		`ipcache_agent_reconciler_errors_total` + ipcacheRound:                        0,
		`ipcache_agent_datapath_packets_total{direction="ingress",verdict="allowed"}`: 0,
		`ipcache_agent_datapath_packets_total{direction="egress",verdict="dropped"}`:  0,
		// No device: nothing tracked.
		`ipcache_agent_conntrack_entries`:         0,
		`ipcache_agent_conntrack_collected_total`: 0,
		`ipcache_agent_conntrack_map_pressure`:    0,
		// Cilium's names.
		`cilium_drop_count_total{direction="INGRESS",reason="Policy denied"}`:            0,
		`cilium_drop_count_total{direction="EGRESS",reason="Policy denied"}`:             0,
		`cilium_forward_count_total{direction="INGRESS"}`:                                0,
		`cilium_forward_count_total{direction="EGRESS"}`:                                 0,
		`cilium_drop_count_total{direction="INGRESS",reason="Invalid packet"}`:           0,
		`cilium_drop_count_total{direction="EGRESS",reason="Invalid packet"}`:            0,
		`cilium_drop_count_total{direction="EGRESS",reason="Policy denied by denylist"}`: 0,
		`cilium_drop_bytes_total{direction="INGRESS",reason="Policy denied"}`:            0,
		`cilium_drop_bytes_total{direction="EGRESS",reason="Policy denied"}`:             0,
		`cilium_drop_bytes_total{direction="INGRESS",reason="Invalid packet"}`:           0,
		`cilium_drop_bytes_total{direction="EGRESS",reason="Invalid packet"}`:            0,
		`cilium_forward_bytes_total{direction="INGRESS"}`:                                0,
		`cilium_forward_bytes_total{direction="EGRESS"}`:                                 0,
		`cilium_bpf_map_pressure{map_name="ipcache"}`:                                    (6.0 + hostAddresses) / 1000,
		`cilium_bpf_map_pressure{map_name="policy"}`:                                     0,
		`cilium_bpf_map_pressure{map_name="conntrack"}`:                                  0,
		`cilium_policy`: 0,
		// No device, no program: nothing to lose.
		`ipcache_agent_events_lost_total{cause="rate_limit"}`: 0,
		`ipcache_agent_events_lost_total{cause="ring_full"}`:  0,
		`ipcache_agent_policy_files{state="in_force"}`:        0,
		`ipcache_agent_policy_files{state="rejected"}`:        1,
	} {
		got, ok := s[series]
		if assert.True(t, ok, "series %s missing", series) {
			assert.Equal(t, want, got, series)
		}
	}
	assert.Contains(t, s, `ipcache_agent_restore_released`)
	assert.Contains(t, s, `ipcache_agent_restore_grace_period_remaining_seconds`)
	assert.Positive(t, s[`ipcache_agent_reconciler_rounds_total`+ipcacheRound], "reconciliation rounds")
	assert.Positive(t, s[`ipcache_agent_reconciler_duration_seconds_count{module_id="datapath",name="ipcache",operation="update"}`],
		"reconciliation durations observed")
	assert.Contains(t, s, `ipcache_agent_map_writes_total{map="policy"}`)
	assert.Contains(t, s, `ipcache_agent_map_writes_total{map="enforcement"}`)
	assert.Contains(t, s, `go_goroutines`)

	requireDashboardServed(t, s)

	// Removing a prefix shows at the next scrape: the walks of tables
	// this small are never spaced (metrics.Walked).
	require.NoError(t, local.Remove(netip.MustParsePrefix("10.1.0.0/16")))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := scrape(c, addr)
		assert.Equal(c, 2.0+hostAddresses, s[`ipcache_agent_ipcache_entries{source="local"}`])
		assert.Equal(c, 4.0+hostAddresses, s[`ipcache_agent_identities{state="allocated"}`])
	}, 10*time.Second, 20*time.Millisecond)
}

// requireDashboardServed checks that every metric the Grafana dashboard
// (docs/grafana) queries is among the scraped series.
func requireDashboardServed(t *testing.T, scraped map[string]float64) {
	t.Helper()
	served := map[string]bool{}
	for series := range scraped {
		name, _, _ := strings.Cut(series, "{")
		served[name] = true
	}
	raw, err := os.ReadFile("../docs/grafana/ipcache-agent.json")
	require.NoError(t, err)
	var dashboard struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &dashboard))
	require.NotEmpty(t, dashboard.Panels)
	for _, panel := range dashboard.Panels {
		require.NotEmpty(t, panel.Targets, panel.Title)
		for _, target := range panel.Targets {
			names := promQLMetricNames(target.Expr)
			require.NotEmpty(t, names, "%s: %s", panel.Title, target.Expr)
			for _, name := range names {
				require.True(t, served[name], "%s: %s queries %s, which is not served", panel.Title, target.Expr, name)
			}
		}
	}
}

var (
	// promQLNoise are the parts of a query that hold no metric name: label
	// matchers and grouping lists, ranges, strings and numbers.
	promQLNoise = regexp.MustCompile(`\{[^}]*\}|\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\[[^\]]*\]|"[^"]*"|\b\d+(\.\d+)?\b`)
	promQLName  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promQLWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "bool": true,
		"and": true, "or": true, "unless": true, "offset": true, "group_left": true, "group_right": true}
)

// promQLMetricNames returns the metric names a PromQL query reads: its
// identifiers that are neither functions (followed by "(") nor keywords.
func promQLMetricNames(expr string) []string {
	var names []string
	for _, token := range promQLName.FindAllString(promQLNoise.ReplaceAllString(expr, " "), -1) {
		if strings.HasSuffix(token, "(") || promQLWords[strings.TrimSpace(token)] {
			continue
		}
		names = append(names, strings.TrimSpace(token))
	}
	return names
}

func TestPromQLMetricNames(t *testing.T) {
	require.Equal(t, []string{"a_total", "b_bucket"}, promQLMetricNames(
		`sum by (direction) (rate(a_total{x="y"}[5m])) / histogram_quantile(0.99, sum by (le) (rate(b_bucket[1m])))`))
}

// newMetricsOnlyHive is a hive of the metrics cell alone: it serves the
// reconciler and Go metrics without touching the kernel.
func newMetricsOnlyHive(t *testing.T, args ...string) (start func() error, server **metricscell.Server) {
	t.Helper()
	var s *metricscell.Server
	h := cells.NewHive(metricscell.Cell, cell.Invoke(func(srv *metricscell.Server) { s = srv }))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse(args))
	log := hivetest.Logger(t)
	return func() error {
		err := h.Start(log, context.Background())
		// A start that fails leaves the hooks it did start running (the
		// database among them) until Stop, as hive.Run does.
		t.Cleanup(func() {
			stopErr := h.Stop(log, context.Background())
			if err == nil {
				require.NoError(t, stopErr)
			}
		})
		return err
	}, &s
}

func TestServerOffByDefault(t *testing.T) {
	start, server := newMetricsOnlyHive(t)
	require.NoError(t, start())
	require.Nil(t, (*server).Addr(), "nothing listens without --prometheus-serve-addr")
}

func TestServerServesAndStops(t *testing.T) {
	var s *metricscell.Server
	h := cells.NewHive(metricscell.Cell, cell.Invoke(func(srv *metricscell.Server) { s = srv }))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse([]string{"--prometheus-serve-addr=127.0.0.1:0"}))
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	addr := s.Addr().String()
	require.Contains(t, scrape(t, addr), "go_goroutines")

	require.NoError(t, h.Stop(log, context.Background()))
	require.Nil(t, s.Addr())
	_, err := http.Get("http://" + addr + "/metrics")
	require.Error(t, err, "the server is shut down on stop")
}

func TestBadAddressNamesTheFlag(t *testing.T) {
	t.Run("not host:port", func(t *testing.T) {
		h := cells.NewHive(metricscell.Cell)
		flags := pflag.NewFlagSet("", pflag.ContinueOnError)
		h.RegisterFlags(flags)
		require.NoError(t, flags.Parse([]string{"--prometheus-serve-addr=no-port"}))
		err := h.Populate(hivetest.Logger(t))
		require.ErrorContains(t, err, "--prometheus-serve-addr")
	})
	t.Run("cannot listen", func(t *testing.T) {
		// A port that is taken: the first hive's.
		first, firstServer := newMetricsOnlyHive(t, "--prometheus-serve-addr=127.0.0.1:0")
		require.NoError(t, first())
		taken := (*firstServer).Addr().String()

		second, _ := newMetricsOnlyHive(t, "--prometheus-serve-addr="+taken)
		err := second()
		require.ErrorContains(t, err, "--prometheus-serve-addr")
		require.ErrorContains(t, err, taken)
	})
	t.Run("port out of range", func(t *testing.T) {
		start, _ := newMetricsOnlyHive(t, "--prometheus-serve-addr=127.0.0.1:99999")
		require.ErrorContains(t, start(), `--prometheus-serve-addr "127.0.0.1:99999"`)
	})
}
