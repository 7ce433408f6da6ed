// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ipcache-agent/ipcache-agent/cells"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newAgentCommand is the agent's root command over the agent's cells, with
// its run replaced by a no-op: the tests look at what the flags hold.
func newAgentCommand() (*cobra.Command, *bytes.Buffer) {
	var stderr bytes.Buffer
	root := NewRootCommand(cells.NewHive(cells.ControlPlane, cells.Shell), "agent", "", "", &stderr, &stderr)
	root.RunE = func(*cobra.Command, []string) error { return nil }
	return root, &stderr
}

// envValues are, by flag type, a value that is not a default and how the
// flag shows it once set.
var envValues = map[string]struct{ set, want string }{
	"string":      {"/env/value", "/env/value"},
	"stringSlice": {"a,b", "[a,b]"},
	"duration":    {"17s", "17s"},
	"uint32":      {"17", "17"},
	"uint16":      {"17", "17"},
	"uint":        {"17", "17"},
	"int":         {"17", "17"},
	"level":       {"debug", "debug"},
	"format":      {"json", "json"},
}

// TestEveryFlagFromEnvironment sets every flag of the run command, found by
// walking its flag set, from IPCACHE_AGENT_<FLAG> alone and checks that the
// flag holds the value.
func TestEveryFlagFromEnvironment(t *testing.T) {
	root, _ := newAgentCommand()
	want := map[string]string{}
	root.Flags().AddFlagSet(root.PersistentFlags())
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		value, ok := envValues[f.Value.Type()]
		if f.Value.Type() == "bool" {
			// The opposite of the default.
			value.set = map[string]string{"true": "false", "false": "true"}[f.DefValue]
			value.want, ok = value.set, true
		}
		require.True(t, ok, "--%s: no test value for a flag of type %s", f.Name, f.Value.Type())
		require.NotEqual(t, f.DefValue, value.want, "--%s: the test value is the default", f.Name)
		t.Setenv(envName(f.Name), value.set)
		want[f.Name] = value.want
	})
	require.Contains(t, want, "state-dir")
	require.Contains(t, want, "log-level")
	require.Equal(t, "IPCACHE_AGENT_STATE_DIR", envName("state-dir"))

	root, stderr := newAgentCommand()
	require.Equal(t, ExitOK, Execute(root, nil, stderr), stderr.String())
	for name, value := range want {
		require.Equal(t, value, root.Flags().Lookup(name).Value.String(), "--%s from %s", name, envName(name))
	}
}

// TestCommandLineOverridesEnvironment: a flag given on the command line
// wins over its variable.
func TestCommandLineOverridesEnvironment(t *testing.T) {
	t.Setenv("IPCACHE_AGENT_STATE_DIR", "/from/env")
	root, stderr := newAgentCommand()
	require.Equal(t, ExitOK, Execute(root, []string{"--state-dir=/from/flag"}, stderr), stderr.String())
	require.Equal(t, "/from/flag", root.Flags().Lookup("state-dir").Value.String())
}

// TestBadEnvironmentValueIsUsageError: a bad value is rejected as the flag
// rejects it (exit 2), naming the variable and the flag.
func TestBadEnvironmentValueIsUsageError(t *testing.T) {
	for _, tc := range []struct{ env, value, flag string }{
		{"IPCACHE_AGENT_LOG_LEVEL", "loud", "--log-level"},
		{"IPCACHE_AGENT_IPCACHE_MAP_MAX_ENTRIES", "lots", "--ipcache-map-max-entries"},
		{"IPCACHE_AGENT_IDENTITY_RESTORE_GRACE_PERIOD", "soon", "--identity-restore-grace-period"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			root, stderr := newAgentCommand()
			require.Equal(t, ExitUsage, Execute(root, nil, stderr))
			require.Contains(t, stderr.String(), tc.env)
			require.Contains(t, stderr.String(), tc.flag)
		})
	}
}

// The hive's own binding of the variables must agree with envName: hive
// prefixes the flag name with cells.EnvPrefix as it is.
func TestHiveBindsTheSameVariables(t *testing.T) {
	t.Setenv("IPCACHE_AGENT_STATE_DIR", "/from/env")
	h := cells.NewHive(cells.ControlPlane)
	require.Equal(t, "/from/env", h.Viper().GetString("state-dir"))
}

// TestInspectLeavesDefaultLogger: `hive` and `hive dot-graph` log through
// the logger of --log-level and --log-format, and slog's default logger,
// the process's, is left as the embedder set it.
func TestInspectLeavesDefaultLogger(t *testing.T) {
	var embedders bytes.Buffer
	before := slog.New(slog.NewTextHandler(&embedders, nil))
	previous := slog.Default()
	slog.SetDefault(before)
	t.Cleanup(func() { slog.SetDefault(previous) })

	var stdout, stderr bytes.Buffer
	root := NewRootCommand(cells.NewHive(cells.ControlPlane, cells.Shell), "agent", "", "", &stdout, &stderr)
	require.Equal(t, ExitOK, Execute(root, []string{"hive", "--log-level=debug", "--log-format=json"}, &stderr), stderr.String())
	require.Same(t, before, slog.Default(), "slog's default logger replaced")
	require.Contains(t, stdout.String(), "Cells:", "the listing goes to the command's stdout")
	require.Contains(t, stderr.String(), `"level":"DEBUG"`, "the hive logs through --log-level and --log-format")
	require.Empty(t, embedders.String(), "nothing logged through the default logger")
}

// TestConfigurationErrorNamesTheVariable: a value from the environment that
// the flag parses but the cell's validation refuses is named by its
// variable as well as its flag, as one the flag refuses is; the same value
// from the command line names the flag alone.
func TestConfigurationErrorNamesTheVariable(t *testing.T) {
	t.Run("environment", func(t *testing.T) {
		t.Setenv("IPCACHE_AGENT_ENABLE_POLICY", "sometimes")
		t.Setenv("IPCACHE_AGENT_STATE_DIR", "/not/named")
		root, stderr := newAgentCommand()
		require.Equal(t, ExitUsage, Execute(root, []string{"hive"}, stderr))
		require.Contains(t, stderr.String(), `agent: invalid configuration: IPCACHE_AGENT_ENABLE_POLICY="sometimes": `+
			`--enable-policy "sometimes": want default, always or never`+"\nRun 'agent hive --help' for usage.\n")
		require.NotContains(t, stderr.String(), "IPCACHE_AGENT_STATE_DIR", "a variable the error is not about")
	})
	t.Run("command line", func(t *testing.T) {
		root, stderr := newAgentCommand()
		require.Equal(t, ExitUsage, Execute(root, []string{"hive", "--enable-policy=sometimes"}, stderr))
		require.Contains(t, stderr.String(), `agent: invalid configuration: --enable-policy "sometimes": want`)
	})
}

func TestMentionsFlag(t *testing.T) {
	for _, tc := range []struct {
		msg, flag string
		want      bool
	}{
		{`--enable-policy "x": bad`, "enable-policy", true},
		{`bad: --policy-dir`, "policy-dir", true},
		{`--policy-dir-x 1, then --policy-dir 2`, "policy-dir", true},
		{`--policy-dir-x 1`, "policy-dir", false},
		{`--policy-map-max-entries must be positive`, "policy", false},
		{`policy-dir without dashes`, "policy-dir", false},
	} {
		require.Equal(t, tc.want, mentionsFlag(tc.msg, tc.flag), "%q names --%s", tc.msg, tc.flag)
	}
}
