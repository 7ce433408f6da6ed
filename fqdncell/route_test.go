// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// TestPrivilegedProxyRoutes: the rule and the local routes that deliver
// the steered DNS to the proxy are added (twice is no error) and removed,
// in a network namespace of the test's own.
func TestPrivilegedProxyRoutes(t *testing.T) {
	privileged.Test(t)
	if !netnstest.InFreshProcessNetns(t, "ipca-fqdn-routes", true) {
		return
	}
	show := func(args ...string) string {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
		return string(out)
	}
	require.NoError(t, installProxyRoutes())
	require.NoError(t, installProxyRoutes(), "what is there already stays")
	for _, family := range []string{"-4", "-6"} {
		rules := show(family, "rule", "show")
		require.Contains(t, rules, "9000:")
		require.Regexp(t, `fwmark 0x200/0xf00 lookup 2004`, rules)
		require.Equal(t, 1, strings.Count(rules, "lookup 2004"), rules)
		require.Contains(t, show(family, "route", "show", "table", "2004"), "local default dev lo")
	}

	removed, err := RemoveProxyRoutes()
	require.NoError(t, err)
	require.True(t, removed)
	for _, family := range []string{"-4", "-6"} {
		require.NotContains(t, show(family, "rule", "show"), "lookup 2004")
		require.Empty(t, strings.TrimSpace(show(family, "route", "show", "table", "2004")))
	}
	removed, err = RemoveProxyRoutes()
	require.NoError(t, err)
	require.False(t, removed, "nothing left to remove")
}
