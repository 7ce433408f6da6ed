// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// startShell starts a shell whose scopes are all OK (zeta.a, zeta.b) but
// one that never reported (zeta.silent).
func startShell(t *testing.T) (string, *syncbuf.Buffer) {
	t.Helper()
	return startShellHealth(t, func(health cell.Health) { health.NewScope("a").OK("fine too") })
}

// startShellDegraded is startShell with zeta.a degraded.
func startShellDegraded(t *testing.T) (string, *syncbuf.Buffer) {
	t.Helper()
	return startShellHealth(t, func(health cell.Health) { health.NewScope("a").Degraded("broken", nil) })
}

func startShellHealth(t *testing.T, reportA func(cell.Health)) (string, *syncbuf.Buffer) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "shell.sock")
	h := NewHive(Shell, cell.Module("zeta", "Reports OK", cell.Invoke(func(health cell.Health) {
		health.NewScope("b").OK("fine")
		reportA(health)
		health.NewScope("silent")
	})))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse([]string{"--shell-sock-path=" + sock}))
	var log syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	require.NoError(t, h.Start(logger, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(hivetest.Logger(t), context.Background())) })
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "Shell listening") },
		5*time.Second, 5*time.Millisecond)
	return sock, &log
}

func exchange(t *testing.T, sock, command string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := ShellExchange(sock, command, &out)
	return out.String(), err
}

// TestShellServesNoWrites: table writes and programs are not served; the
// read commands are.
func TestShellServesNoWrites(t *testing.T) {
	sock, _ := startShell(t)
	for _, command := range []string{"db/insert health x.yaml", "db/delete health x.yaml", "exec /bin/true"} {
		_, err := exchange(t, sock, command)
		require.ErrorContains(t, err, "unknown command", command)
	}
	_, err := exchange(t, sock, "db/get --delete health x")
	require.ErrorContains(t, err, "--delete is not served")
	out, err := exchange(t, sock, "help")
	require.NoError(t, err)
	for _, name := range []string{"db/show", "db/get", "health"} {
		require.Contains(t, out, name)
	}
	for _, name := range []string{"db/insert", "db/delete", "exec"} {
		require.NotRegexp(t, `(?m)^`+name+`\b`, out)
	}
	_, err = exchange(t, sock, "db")
	require.NoError(t, err)
}

// TestShellWritesNoFiles: the --out (-o) of db/show, db/dump and the query
// commands, which would write a file as root inside the agent, is
// refused; without it the output goes to the client.
func TestShellWritesNoFiles(t *testing.T) {
	sock, _ := startShellWithPrefixes(t, 3)
	dir := t.TempDir()
	for _, command := range []string{"db/show -o %s ipcache", "db/show --out=%s ipcache", "db/dump --out %s",
		"db/get -o %s ipcache 10.0.0.1/32", "db/prefix --out=%s ipcache 10.0.0.0/8", "db/list -o %s ipcache 10.0.0.1/32",
		"db/lowerbound -o %s ipcache 10.0.0.0/32"} {
		file := filepath.Join(dir, "out")
		_, err := exchange(t, sock, fmt.Sprintf(command, file))
		require.ErrorContains(t, err, "--out (-o) is not served", command)
		require.NoFileExists(t, file, command)
	}
	out, err := exchange(t, sock, "db/show ipcache")
	require.NoError(t, err)
	require.Contains(t, out, "10.0.0.2/32", "without --out, to the client")
	out, err = exchange(t, sock, "help db/show")
	require.NoError(t, err)
	require.NotContains(t, out, "File to write to", "not among the flags of the usage")
}

// TestShellHealthSortedWithoutEmptyRows: `health` lists the scopes that
// reported, sorted, and no empty line, nor an empty error=; it fails,
// naming the scope, when one is degraded; an error comes back once, as
// the error, not also as output.
func TestShellHealthSortedWithoutEmptyRows(t *testing.T) {
	sock, _ := startShellDegraded(t)
	out, err := exchange(t, sock, "health")
	require.ErrorContains(t, err, "not healthy: zeta.a (Degraded)")
	require.NotContains(t, err.Error(), "zeta.b")
	rows := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.True(t, slices.IsSorted(rows), "sorted: %q", rows)
	require.NotContains(t, rows, "")
	require.Contains(t, rows, "zeta.a: level=Degraded message=broken")
	require.Contains(t, rows, "zeta.b: level=OK message=fine")
	for _, row := range rows {
		require.NotContains(t, row, "level= ", "a scope that never reported")
	}

	out, err = exchange(t, sock, "db/show nosuch")
	require.ErrorContains(t, err, `table "nosuch" not found`)
	require.Empty(t, out, "the error is not also output")
}

// TestShellHealthOK: with every scope OK, `health` succeeds.
func TestShellHealthOK(t *testing.T) {
	sock, _ := startShell(t)
	out, err := exchange(t, sock, "health")
	require.NoError(t, err)
	require.Contains(t, out, "zeta.a: level=OK message=fine too\nzeta.b: level=OK message=fine\n")
	require.NotContains(t, out, "error=")
	out, err = exchange(t, sock, "health 'zeta.b: level=OK message=fine error'")
	require.NoError(t, err, "a pattern may anchor on the error= of older output")
	require.Equal(t, "matched: zeta.b: level=OK message=fine\n", out)
}

// TestShellHealthWaitIsBounded: the shell's `health <pattern>` gives up
// after --timeout (10 s by default), saying what it waited for.
func TestShellHealthWaitIsBounded(t *testing.T) {
	sock, _ := startShell(t)
	start := time.Now()
	out, err := exchange(t, sock, "health --timeout=300ms level=Degraded")
	require.Empty(t, out)
	require.ErrorContains(t, err, `not healthy: no health row matched "level=Degraded" within 300ms`)
	require.Equal(t, 1, strings.Count(err.Error(), "no health row"), "once: %v", err)
	require.Less(t, time.Since(start), 5*time.Second)
	_, err = exchange(t, sock, "help health")
	require.NoError(t, err)
	out, err = exchange(t, sock, "help -v ^health$")
	require.NoError(t, err)
	require.Contains(t, out, "(default 10s)")
}

// TestShellHealthJSON: health -o json is one array of the rows' fields.
func TestShellHealthJSON(t *testing.T) {
	sock, _ := startShellDegraded(t)
	out, err := exchange(t, sock, "health -o json")
	require.ErrorContains(t, err, "not healthy: zeta.a (Degraded)", "the rows, and the exit code")
	var rows []struct{ Scope, Level, Message, Error string }
	require.NoError(t, json.Unmarshal([]byte(out), &rows), "%s", out)
	require.Contains(t, out, `"scope": "zeta.a"`, "lowerCamel field names")
	require.Contains(t, rows, struct{ Scope, Level, Message, Error string }{"zeta.a", "Degraded", "broken", ""})
	require.Contains(t, rows, struct{ Scope, Level, Message, Error string }{"zeta.b", "OK", "fine", ""})
	require.True(t, slices.IsSortedFunc(rows, func(a, b struct{ Scope, Level, Message, Error string }) int {
		return strings.Compare(a.Scope, b.Scope)
	}))
	_, err = exchange(t, sock, "health -o yaml")
	require.ErrorContains(t, err, "want text or json")
}

// TestShellConnectionLogsAtDebug: a client connecting and leaving logs
// nothing at info.
func TestShellConnectionLogsAtDebug(t *testing.T) {
	sock, log := startShell(t)
	before := strings.Count(log.String(), "level=INFO")
	_, err := exchange(t, sock, "health")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "Shell client disconnected") },
		5*time.Second, 5*time.Millisecond)
	require.Equal(t, before, strings.Count(log.String(), "level=INFO"), "log: %s", log)
	require.Contains(t, log.String(), `level=DEBUG msg="Shell client connected"`)
}

// TestShellExchangeNoAgentFailsAtOnce: no agent on the socket is ErrNoAgent
// naming the path, without waiting.
func TestShellExchangeNoAgentFailsAtOnce(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "shell.sock")
	start := time.Now()
	_, err := exchange(t, sock, "health")
	require.ErrorIs(t, err, ErrNoAgent)
	require.ErrorContains(t, err, sock)
	require.Less(t, time.Since(start), time.Second)
}

// TestShellExchangeWritesBeforeWaiting: the client holds what it copies
// only until it reads the connection again, so a command that goes on
// (db/watch) has its first listing written while it still runs; and a
// write that fails ends the exchange with the write's error.
func TestShellExchangeWritesBeforeWaiting(t *testing.T) {
	sock, _ := startShellWithPrefixes(t, 3)
	seenEnough := errors.New("seen enough")
	var written bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		written.Write(p)
		if strings.Contains(written.String(), "10.0.0.2/32") {
			return 0, seenEnough
		}
		return len(p), nil
	})
	done := make(chan error, 1)
	go func() { done <- ShellExchange(sock, "db/watch ipcache", w) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, seenEnough, "the watch's listing written while it runs, and the write's error returned")
	case <-time.After(30 * time.Second):
		t.Fatal("the watch's first listing was not written while it runs")
	}
}

// TestShellErrorOnceWithUsage: a command's error comes back once, as the
// error (not also as output, though the command wrote it to its stderr
// too), without the engine's "<stdin>:0: ", and with the command's usage
// when it is one of usage.
func TestShellErrorOnceWithUsage(t *testing.T) {
	sock, _ := startShell(t)
	out, err := exchange(t, sock, "health -o yaml")
	require.Empty(t, out)
	require.EqualError(t, err, "health: -o yaml: want text or json")

	out, err = exchange(t, sock, "health a b")
	require.Empty(t, out)
	require.ErrorContains(t, err, "health a b: invalid usage\nusage: health [-o] [--output=string] [--timeout=duration] (pattern)\n")
	require.ErrorContains(t, err, "--timeout duration")
	require.NotContains(t, err.Error(), "<stdin>")

	out, err = exchange(t, sock, "db/show --nosuch identities")
	require.Empty(t, out)
	require.ErrorContains(t, err, "unknown flag: --nosuch\nusage: db/show ")

	out, err = exchange(t, sock, "nosuch")
	require.Empty(t, out)
	require.EqualError(t, err, "nosuch: unknown command", "no usage for a command that does not exist")
}

// TestShellScript: the commands of a reader run one after the other on
// one connection, outputs on stdout, errors once on stderr; a failure does
// not stop the others, and is the error at the end.
func TestShellScript(t *testing.T) {
	sock, _ := startShell(t)
	var stdout, stderr bytes.Buffer
	err := ShellScript(sock, strings.NewReader("health\n\n# comment\nhealth -o yaml\nhelp health\nexit\nhealth\n"), &stdout, &stderr)
	require.ErrorIs(t, err, ErrShellCommandsFailed)
	require.ErrorContains(t, err, "1 of 3")
	require.Equal(t, "health: -o yaml: want text or json\n", stderr.String())
	require.Equal(t, 1, strings.Count(stdout.String(), "zeta.b: level=OK"), "nothing after exit: %s", &stdout)
	require.Contains(t, stdout.String(), "Show health")

	stdout.Reset()
	stderr.Reset()
	require.NoError(t, ShellScript(sock, strings.NewReader("health\n"), &stdout, &stderr))
	require.Empty(t, stderr.String())
}

// TestShellHelpReflowsDetail: a command's help text, wrapped by its author
// wider than hive's help wraps it, comes out in whole lines of at most
// helpWidth, sentences unbroken; lines that fit (lists, examples) stay as
// written.
func TestShellHelpReflowsDetail(t *testing.T) {
	detail := []string{
		"The first line counts the `ipcache` table's entries by status: done (in",
		"the ipcache map), pending (not written yet), error (the write failed or",
		"is held for make before break.",
		"-o json: one object.",
		"A list:",
		"- one",
		"- two",
	}
	require.Equal(t, []string{
		"The first line counts the `ipcache` table's entries by status: done (in the ipcache map), pending (not written yet), error (the write failed or is held for make before break.",
		"-o json: one object.",
		"A list:",
		"- one",
		"- two",
	}, detailParagraphs(detail))

	sock := filepath.Join(t.TempDir(), "shell.sock")
	h := NewHive(Shell, cell.Provide(func() hive.ScriptCmdsOut {
		return hive.NewScriptCmds(map[string]script.Cmd{"test/wide": script.Command(
			script.CmdUsage{Summary: "A command with wide help", Detail: detail},
			func(*script.State, ...string) (script.WaitFunc, error) { return nil, nil })})
	}))
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse([]string{"--shell-sock-path=" + sock}))
	require.NoError(t, h.Start(hivetest.Logger(t), context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(hivetest.Logger(t), context.Background())) })
	require.Eventually(t, func() bool { _, err := exchange(t, sock, "help"); return err == nil },
		5*time.Second, 5*time.Millisecond)
	out, err := exchange(t, sock, "help test/wide")
	require.NoError(t, err)
	require.Contains(t, out, "\tstatus: done (in the ipcache map), pending (not written\n", out)
	require.Contains(t, out, "\t- one\n\t- two\n", out)
	for line := range strings.Lines(out) {
		require.LessOrEqual(t, len(strings.TrimSuffix(line, "\n")), helpWidth+1, "%q", line)
	}
}
