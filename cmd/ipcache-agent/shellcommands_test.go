// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// shellCase is how TestPrivilegedShellCommandsJSONAndErrors runs one
// command of the agent's shell.
type shellCase struct {
	// args are valid arguments, for -o json, with the files the test
	// gives the agent.
	args []string
	// array: its -o json is documented as an array.
	array bool
	// noJSON says why a command with -o is not run with -o json.
	noJSON string
	// badError is the error of `<command> --no-such-flag`, once on
	// stderr; "" is pflag's "unknown flag: --no-such-flag".
	badError string
	// noUsage says why that error comes without the command's usage.
	noUsage string
	// noBad says why no argument is a bad one for the command.
	noBad string
}

// shellCases covers every command of the agent's shell: a command the
// shell's `help` lists and this table does not fails the test, so a new
// command gets a case.
var shellCases = map[string]shellCase{
	"bpf/ipcache":             {},
	"bpf/policy":              {},
	"conntrack/flush":         {badError: "invalid usage"}, // no flags: --no-such-flag is an argument it does not take
	"conntrack/list":          {array: true},
	"datapath/counters":       {},
	"datapath/events-lost":    {},
	"datapath/ipcache-status": {},
	"db":                      {noBad: "statedb's: it takes no arguments and ignores any"},
	"db/cmp":                  {},
	"db/dump":                 {}, // its JSON: shellTableRows
	"db/empty":                {badError: `table "--no-such-flag" not found`, noUsage: statedbTableArg},
	"db/get":                  {},
	"db/initialized":          {},
	"db/list":                 {},
	"db/lowerbound":           {},
	"db/prefix":               {},
	"db/show":                 {}, // its --format=json: shellTableRows
	"db/watch":                {badError: `table "--no-such-flag" not found`, noUsage: statedbTableArg},
	"endpoint/get":            {args: []string{"shop/web-1"}},
	"endpoint/list":           {array: true},
	"fqdn/cache-list":         {array: true},
	"health":                  {array: true}, // without a pattern: with one it waits for a row
	"help":                    {noBad: "its argument is a regular expression: none is a bad one"},
	"identity/get":            {args: []string{"2"}},
	"identity/list":           {array: true},
	"identity/show":           {args: []string{"2"}},
	"ipcache/lookup":          {args: []string{"10.1.2.3"}},
	"monitor":                 {noJSON: "it streams until its client leaves: monitor_test.go reads its -o json lines"},
	"node/addresses":          {array: true},
	"policy/explain":          {args: []string{"10.1.2.3", "egress", "TCP/443"}},
	"policy/list":             {array: true},
	"restore/status":          {},
}

// statedbTableArg is why db/empty's and db/watch's bad argument comes
// without usage.
const statedbTableArg = "statedb's: it has no flags, so --no-such-flag is a table name, and an unknown table is its own error, not one of usage (the shell adds the usage to usage errors only)"

// shellCaseFiles are the policy and endpoint the agent reads, for the
// cases' arguments: 10.1.2.3 in a policy's CIDR, a remote endpoint (a
// local one on no device would make health degraded).
const (
	shellCasePolicy = `name: web
egress:
  - toCIDR: [10.0.0.0/8]
    toPorts: [{port: 443, protocol: TCP}]
ingressDeny:
  - fromCIDR: [192.0.2.0/24]
`
	shellCaseEndpoint = `apiVersion: ipcache-agent.io/v1
kind: Endpoint
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec: {addresses: [10.9.0.1], node: node-b}
`
)

// TestPrivilegedShellCommandsJSONAndErrors runs every command of the
// agent's shell, as its `help` lists them (and `shell --help` does, without
// an agent): with -o json (when it has -o) and valid arguments it exits 0,
// prints one JSON document (an array where documented) whose object keys
// are lowerCamel, and nothing on stderr; with --no-such-flag it exits 1,
// prints nothing on stdout and its error once on stderr with the command's
// usage. The table rows of db/dump and db/show --format=json follow the
// same key rule, with direction, protocol and verdict as names.
func TestPrivilegedShellCommandsJSONAndErrors(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	dirs := newAgentDirs(t)
	policyDir, endpointDir := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "web.yaml"), []byte(shellCasePolicy), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(endpointDir, "web.yaml"), []byte(shellCaseEndpoint), 0o600))
	agent := startAgentProcess(t, agentCommand(dirs.args("--policy-dir="+policyDir, "--endpoint-dir="+endpointDir, "--node-name=node-a")...))
	agent.waitStarted(t)
	shell := func(args ...string) (string, string, int) {
		// A binary built with -race sleeps 1 s at exit unless told not to.
		return runAgentCommandEnv(t, []string{"GORACE=atexit_sleep_ms=0"},
			append([]string{"shell", "--shell-sock-path=" + dirs.sockPath()}, args...)...)
	}
	require.Eventually(t, func() bool {
		_, _, health := shell("health")
		_, _, lookup := shell("ipcache/lookup", "10.1.2.3")
		_, _, ep := shell("endpoint/get", "shop/web-1")
		return health == agentcmd.ExitOK && lookup == agentcmd.ExitOK && ep == agentcmd.ExitOK
	}, 30*time.Second, 100*time.Millisecond, "agent healthy, with its policy and endpoint")

	help, stderr, code := shell("help")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	usages := shellUsages(help)
	require.NotEmpty(t, usages, help)
	names := slices.Sorted(maps.Keys(usages))

	listed, stderr, code := runAgentCommand(t, "shell", "--help")
	require.Equal(t, agentcmd.ExitOK, code, stderr)
	var summaries []string
	for _, m := range regexp.MustCompile(`(?m)^  (\S+)  +\S`).FindAllStringSubmatch(listed, -1) {
		summaries = append(summaries, m[1])
	}
	require.Equal(t, names, summaries, "shell --help lists the running agent's commands")

	var uncovered, stale []string
	for _, name := range names {
		if _, ok := shellCases[name]; !ok {
			uncovered = append(uncovered, name)
		}
	}
	for name := range shellCases {
		if _, ok := usages[name]; !ok {
			stale = append(stale, name)
		}
	}
	require.Empty(t, uncovered, "commands not covered: add them to shellCases")
	require.Empty(t, stale, "shellCases has commands the shell does not serve")

	for _, name := range names {
		c := shellCases[name]
		t.Run(name, func(t *testing.T) {
			hasOutput := strings.Contains(usages[name], "[--output=string]")
			if !hasOutput {
				require.False(t, c.array || len(c.args) > 0 || c.noJSON != "", "%s has no -o: its case says otherwise", name)
			}
			if hasOutput && c.noJSON == "" {
				stdout, stderr, code := shell(append([]string{name, "-o", "json"}, c.args...)...)
				require.Equal(t, agentcmd.ExitOK, code, "%s -o json: %s", name, stderr)
				require.Empty(t, stderr)
				requireJSONDocument(t, stdout, c.array)
			}
			if c.noBad != "" {
				return
			}
			stdout, stderr, code := shell(name, "--no-such-flag")
			require.Equal(t, agentcmd.ExitFailure, code, stderr)
			require.Empty(t, stdout, "an error is not output")
			want := c.badError
			if want == "" {
				want = "unknown flag: --no-such-flag"
			}
			require.True(t, strings.HasPrefix(stderr, "ipcache-agent: "+name+" --no-such-flag: "+want+"\n"), stderr)
			require.Equal(t, 1, strings.Count(stderr, want), "the error once: %s", stderr)
			if c.noUsage == "" {
				require.Regexp(t, `\nusage: `+regexp.QuoteMeta(name)+`( |\n)`, stderr, "with the command's usage")
				require.Equal(t, 1, strings.Count(stderr, "usage: "), stderr)
			} else {
				require.NotContains(t, stderr, "usage: ")
			}
		})
	}

	t.Run("table rows", func(t *testing.T) {
		stdout, stderr, code := shell("db/dump")
		require.Equal(t, agentcmd.ExitOK, code, stderr)
		requireJSONDocument(t, stdout, false)
		var tables map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(stdout), &tables))
		require.Contains(t, tables, "policy")
		for table := range tables {
			stdout, stderr, code := shell("db/show", "--format=json", table)
			require.Equal(t, agentcmd.ExitOK, code, "%s: %s", table, stderr)
			require.Empty(t, stderr)
			// statedb's format: one object after another.
			dec := json.NewDecoder(strings.NewReader(stdout))
			for {
				var row any
				err := dec.Decode(&row)
				if errors.Is(err, io.EOF) {
					break
				}
				require.NoError(t, err, "%s: %s", table, stdout)
				require.Empty(t, badJSONKeys(row, table), "%s", stdout)
			}
		}
		stdout, _, _ = shell("db/show", "--format=json", "policy")
		require.Contains(t, stdout, `"direction": "egress"`)
		require.Contains(t, stdout, `"verdict": "deny"`)
	})
}

// shellUsages returns the usage line of each command the shell's `help`
// lists, by name.
func shellUsages(help string) map[string]string {
	usages := map[string]string{}
	for line := range strings.Lines(help) {
		line = strings.TrimRight(line, "\n")
		if line == "" || strings.HasPrefix(line, "\t") || line == "commands:" {
			continue
		}
		usages[strings.Fields(line)[0]] = line
	}
	return usages
}

// requireJSONDocument requires out to be one JSON document (an array if
// array) whose object keys are lowerCamel.
func requireJSONDocument(t *testing.T, out string, array bool) {
	t.Helper()
	require.True(t, json.Valid([]byte(out)), "not one JSON document: %s", out)
	if array {
		require.True(t, strings.HasPrefix(strings.TrimSpace(out), "["), "not an array: %s", out)
	}
	var doc any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Empty(t, badJSONKeys(doc, ""), "%s", out)
}

// enumKeys are the fields that hold the policy enums: names, not numbers.
var enumKeys = []string{"direction", "protocol", "verdict"}

// badJSONKeys returns the paths of the keys of doc's objects that are not
// lowerCamel (they have a '_' or do not start with a lowercase letter),
// and of the enum fields that are numbers. ("ext-headers", a drop
// reason's name as a key, is a value's name, not a field's.)
func badJSONKeys(doc any, path string) []string {
	var bad []string
	switch v := doc.(type) {
	case map[string]any:
		for key, value := range v {
			at := path + "." + key
			first, _ := utf8.DecodeRuneInString(key)
			if strings.Contains(key, "_") || !unicode.IsLower(first) {
				bad = append(bad, at)
			}
			if _, isNumber := value.(float64); isNumber && slices.Contains(enumKeys, key) {
				bad = append(bad, at+" (a number)")
			}
			bad = append(bad, badJSONKeys(value, at)...)
		}
	case []any:
		for _, value := range v {
			bad = append(bad, badJSONKeys(value, path+"[]")...)
		}
	}
	return bad
}
