// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersionJSON: version -o json is one object with the Go version, the
// embedded object's SHA-256 and both programs' tags; with no agent's pins
// under --bpf-root, nothing attached and no error.
func TestVersionJSON(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run([]string{"version", "-o", "json", "--bpf-root", t.TempDir()}, &stdout, &stderr)
	require.Zero(t, code, "stderr: %s", &stderr)
	var v map[string]any
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &v), "%s", &stdout)
	require.Equal(t, runtime.Version(), v["goVersion"])
	require.Regexp(t, `^[0-9a-f]{64}$`, v["bpfObjectSha256"])
	require.Equal(t, []any{"enforce_from_endpoint", "enforce_to_endpoint"}, v["programs"])
	require.Equal(t, []any{}, v["attached"])
	require.NotContains(t, v, "attachedError")
	for _, field := range []string{"module", "version", "commit", "commitTime", "modified", "platform"} {
		require.Contains(t, v, field)
	}

	stdout.Reset()
	require.Zero(t, run([]string{"version", "--bpf-root", t.TempDir()}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "BPF object sha256: "+v["bpfObjectSha256"].(string))
	require.Contains(t, stdout.String(), "Attached: none (no pinned links)")
	require.Equal(t, 2, run([]string{"version", "-o", "yaml"}, &stdout, &stderr))
}
