// SPDX-License-Identifier: Apache-2.0

package events

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// DNS events are the proxy's: their kind is no bit of the program's mask.
func TestDNSKindNotProgram(t *testing.T) {
	require.Zero(t, DNSQueries&ProgramKinds)
	require.Equal(t, Drops|Verdicts, ProgramKinds)
}

// The verdicts' names are the monitor's (docs/CONTRACT.md).
func TestDNSVerdictString(t *testing.T) {
	for v, name := range map[DNSVerdict]string{DNSForwarded: "forwarded", DNSRefused: "refused", DNSFailed: "failed", 0: "dns-verdict-0"} {
		require.Equal(t, name, v.String())
	}
}
