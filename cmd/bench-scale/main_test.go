// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The harness runs every step at a small size, and its guarantees hold: a
// restart renumbers nothing and rewrites no unchanged value; unrelated
// upserts are measured before and during the release.
func TestPrivilegedHarnessSmall(t *testing.T) {
	privileged.Test(t)
	r, err := runScenario(scenario{family: "mixed", n: 2000}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Positive(t, r.floorRandom)
	require.Positive(t, r.tableInsert)
	require.Positive(t, r.endToEnd)
	require.Positive(t, r.restart)
	require.Zero(t, r.restartRenumbered, "renumbered by the restart")
	require.Zero(t, r.restartUnchangedWrites, "unchanged values rewritten by the restart")
	require.Zero(t, r.restartWrites, "map writes by the restart")
	// An entry is reconciled once restored and again when its owner
	// re-asserts it (its source changes): skipped once or twice.
	require.GreaterOrEqual(t, r.restartSkipped, uint64(2000), "each unchanged value skipped")
	require.Positive(t, r.graceRelease)
	require.Positive(t, r.idleN, "upserts measured before the release")
	require.Positive(t, r.heapPerPrefix)

	var out bytes.Buffer
	printTable(&out, []result{r})
	require.Len(t, strings.Split(strings.TrimSpace(out.String()), "\n"), 2, out.String())
	require.Contains(t, out.String(), "mixed 2k")
}

func TestParseScenarios(t *testing.T) {
	s, err := parseScenarios("100000,1000000", "ipv4,mixed")
	require.NoError(t, err)
	require.Len(t, s, 4)
	_, err = parseScenarios("0", "ipv4")
	require.ErrorContains(t, err, "-sizes")
	_, err = parseScenarios("10", "ipv5")
	require.ErrorContains(t, err, "-families")
}
