// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// TestCheckpointRoundTrip: a cache written and read back into a new
// cache after a restart holds the same pairs; the ones that expired
// meanwhile come back deferred, kept while in use.
func TestCheckpointRoundTrip(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{}, clk.now)
	c.Add(answerOf("api.example.com", 60, "192.0.2.1", "2001:db8::1"))
	c.Add(answerOf("www.example.com", 5, "192.0.2.1"))
	clk.advance(6 * time.Second)
	require.Empty(t, c.GC(inUse("192.0.2.1"))) // www's pair deferred, in use
	before := c.Entries()

	var buf bytes.Buffer
	require.NoError(t, fqdn.WriteCheckpoint(&buf, before))
	require.Equal(t, 5, strings.Count(buf.String(), "\n"), "one entry per line:\n%s", buf.String())
	entries, err := fqdn.ReadCheckpoint(bytes.NewReader(buf.Bytes()), 3)
	require.NoError(t, err)
	require.Len(t, entries, 3)

	restarted := fqdn.NewCache(fqdn.Config{}, clk.now)
	u := restarted.Restore(entries)
	require.Len(t, u.Added, 3)
	require.Equal(t, before, restarted.Entries())

	// The deferred pair goes when no connection uses it any more.
	require.Empty(t, restarted.GC(inUse("192.0.2.1")))
	clk.advance(time.Second)
	require.Equal(t, []string{"www.example.com 192.0.2.1 last=false"}, removedPairs(restarted.GC(nil)))
	// Expired while the agent was down: deferred from the restore.
	clk.advance(time.Hour)
	down := fqdn.NewCache(fqdn.Config{IdleGrace: time.Minute}, clk.now)
	u = down.Restore(entries)
	require.Len(t, u.Added, 3)
	for _, e := range down.Entries() {
		require.True(t, e.Deferred)
	}
	require.Empty(t, down.GC(nil))
	clk.advance(time.Minute)
	require.Len(t, down.GC(nil), 3)
}

func TestCheckpointEmpty(t *testing.T) {
	entries, err := fqdn.ReadCheckpoint(strings.NewReader(""), 10)
	require.NoError(t, err)
	require.Empty(t, entries)

	var buf bytes.Buffer
	require.NoError(t, fqdn.WriteCheckpoint(&buf, nil))
	require.Equal(t, "{\"version\":1,\"entries\":[\n]}\n", buf.String())
	entries, err = fqdn.ReadCheckpoint(&buf, 0)
	require.NoError(t, err)
	require.Empty(t, entries)
}

func TestCheckpointCorrupt(t *testing.T) {
	line := func(name, addr, expires string) string {
		return fmt.Sprintf(`{"name":%q,"address":%q,"expires":%q}`, name, addr, expires)
	}
	ok := line("a.example.com", "192.0.2.1", "2026-01-02T03:04:05Z")
	file := func(entries ...string) string {
		return "{\"version\":1,\"entries\":[\n" + strings.Join(entries, ",\n") + "\n]}\n"
	}
	tests := []struct {
		name, data, says string
	}{
		{"not JSON", "{version", "invalid character"},
		{"truncated", file(ok)[:40], "unexpected EOF"},
		{"trailing data", file(ok) + "{}", "trailing data"},
		{"version", strings.Replace(file(ok), `"version":1`, `"version":2`, 1), "version 2, want 1"},
		{"unknown field", strings.Replace(file(ok), `"expires"`, `"ttl":1,"expires"`, 1), "unknown field"},
		{"upper case name", file(line("A.example.com", "192.0.2.1", "2026-01-02T03:04:05Z")), "not a canonical DNS name"},
		{"final dot", file(line("a.example.com.", "192.0.2.1", "2026-01-02T03:04:05Z")), "not a canonical DNS name"},
		{"bad name", file(line("a b.com", "192.0.2.1", "2026-01-02T03:04:05Z")), "not a canonical DNS name"},
		{"root", file(line(".", "192.0.2.1", "2026-01-02T03:04:05Z")), "not a canonical DNS name"},
		{"bad address", file(line("a.example.com", "192.0.2.300", "2026-01-02T03:04:05Z")), "ParseAddr"},
		{"no address", file(line("a.example.com", "", "2026-01-02T03:04:05Z")), "not an IPv4 or IPv6 address"},
		{"zone", file(line("a.example.com", "fe80::1%eth0", "2026-01-02T03:04:05Z")), "not an IPv4 or IPv6 address"},
		{"mapped", file(line("a.example.com", "::ffff:192.0.2.1", "2026-01-02T03:04:05Z")), "not an IPv4 or IPv6 address"},
		{"bad time", file(line("a.example.com", "192.0.2.1", "yesterday")), "cannot parse"},
		{"no expiry", file(`{"name":"a.example.com","address":"192.0.2.1"}`), "no expiry"},
		{"twice", file(ok, ok), "listed twice"},
		{"too many", file(ok, line("b.example.com", "192.0.2.1", "2026-01-02T03:04:05Z"), line("c.example.com", "192.0.2.1", "2026-01-02T03:04:05Z")), "3 entries, more than 2"},
		{"too large", file(ok) + strings.Repeat(" ", 2000), "larger than 1088 bytes"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			_, err := fqdn.ReadCheckpoint(strings.NewReader(test.data), 2)
			require.ErrorIs(t, err, fqdn.ErrCorruptCheckpoint)
			require.ErrorContains(t, err, test.says)
			require.ErrorContains(t, err, "decode fqdn checkpoint: corrupt fqdn checkpoint")
		})
	}
}

// TestCheckpointBound: the largest cache the caps allow, each name as
// long as it may be, fits in MaxCheckpointSize of its entry count.
func TestCheckpointBound(t *testing.T) {
	var entries []fqdn.Entry
	label := strings.Repeat("a", 63)
	for i := range 100 {
		name := fmt.Sprintf("%s.%s.%s.%s", label, label, label, label)[:251] + fmt.Sprintf("%03d", i)
		entries = append(entries, fqdn.Entry{
			Name:    name,
			Addr:    netip.MustParseAddr(fmt.Sprintf("ffff:ffff:ffff:ffff:ffff:ffff:ffff:%x", i)),
			Expires: time.Date(2262, 4, 11, 23, 47, 16, 854775807, time.UTC),
		})
	}
	var buf bytes.Buffer
	require.NoError(t, fqdn.WriteCheckpoint(&buf, entries))
	require.LessOrEqual(t, int64(buf.Len()), fqdn.MaxCheckpointSize(len(entries)))
	got, err := fqdn.ReadCheckpoint(&buf, len(entries))
	require.NoError(t, err)
	require.Equal(t, entries, got)
}
