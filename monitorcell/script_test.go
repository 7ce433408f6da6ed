// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/miekg/dns"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// newScriptEngine builds a hive of the monitor cell with no program loaded
// (no --devices) and the `endpoints` table, whose rows the scripts write,
// and test/monitor-dns, which publishes DNS events as the DNS proxy does
// (through the hive's events.DNSPublisher) to a running monitor.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	var (
		hub       *Hub
		publisher events.DNSPublisher
	)
	h := hive.New(
		statedb.Cell,
		cell.Provide(func() events.Source { return &fakeSource{} }),
		cell.Provide(endpoint.NewTable, statedb.RWTable[*endpoint.State].ToTable),
		Cell,
		cell.Invoke(func(h *Hub, p events.DNSPublisher) { hub, publisher = h, p }),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse(args))
	log := hivetest.Logger(t)
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	cmds, err := h.ScriptCommands(log)
	require.NoError(t, err)
	maps.Copy(cmds, script.DefaultCmds())
	engine := &script.Engine{Cmds: cmds}
	cmds["test/monitor-dns"] = script.Command(
		script.CmdUsage{
			Summary: "Run monitor with the given flags, publish the file's DNS events to it, and show what it wrote",
			Args:    "events-file monitor-flags...",
			Detail: []string{
				"One event per line: client server endpoint name qtype rcode verdict held [addresses],",
				"at 2026-12-04T12:00:00Z; addresses comma-separated. The monitor's output",
				"(its lines, once every event was handed to it) is the stdout.",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 1 {
				return nil, script.ErrUsage
			}
			published, err := readDNSEvents(s.Path(args[0]))
			if err != nil {
				return nil, err
			}
			out, err := runMonitor(s, engine, hub, args[1:], func() {
				for _, e := range published {
					publisher.PublishDNS(e)
				}
			})
			if err != nil {
				return func(*script.State) (string, string, error) { return "", err.Error() + "\n", err }, nil
			}
			return func(*script.State) (string, string, error) { return out, "", nil }, nil
		})
	return engine
}

// runMonitor runs the engine's monitor with flags until publish has run
// and the monitor took every DNS event, and returns what it wrote. The
// monitor writes to its state's log until its client leaves: it runs on
// a state of its own, left by cancelling it.
func runMonitor(s *script.State, engine *script.Engine, hub *Hub, flags []string, publish func()) (string, error) {
	ctx, cancel := context.WithCancel(s.Context())
	defer cancel()
	monitorState, err := script.NewState(ctx, s.Getwd(), nil)
	if err != nil {
		return "", err
	}
	var log bytes.Buffer
	done := make(chan error, 1)
	go func() {
		line := Command + " " + strings.Join(flags, " ") + "\n"
		done <- engine.Execute(monitorState, "", bufio.NewReader(strings.NewReader(line)), &log)
	}()
	for hub.dnsCount.Load() == 0 {
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("monitor returned")
			}
			return "", err
		case <-time.After(time.Millisecond):
		}
	}
	publish()
	for !hub.dnsTaken() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return "", err
	}
	var out strings.Builder
	for line := range strings.Lines(log.String()) {
		if !strings.HasPrefix(line, "> ") {
			out.WriteString(line)
		}
	}
	return out.String(), nil
}

// dnsTaken reports whether every DNS subscriber took every event.
func (h *Hub) dnsTaken() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.dnsSubs {
		if len(s.ch) > 0 {
			return false
		}
	}
	return true
}

// readDNSEvents reads test/monitor-dns's events file.
func readDNSEvents(path string) ([]events.DNS, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []events.DNS
	verdicts := map[string]events.DNSVerdict{"forwarded": events.DNSForwarded, "refused": events.DNSRefused, "failed": events.DNSFailed}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 8 || len(f) > 9 {
			return nil, fmt.Errorf("%q: want client server endpoint name qtype rcode verdict held [addresses]", line)
		}
		e := events.DNS{Time: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC), Name: f[3], Verdict: verdicts[f[6]]}
		if e.Client, err = netip.ParseAddrPort(f[0]); err != nil {
			return nil, err
		}
		if e.Server, err = netip.ParseAddrPort(f[1]); err != nil {
			return nil, err
		}
		ep, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return nil, err
		}
		e.Endpoint = identity.Number(ep)
		var ok bool
		if e.Type, ok = dns.StringToType[f[4]]; !ok {
			return nil, fmt.Errorf("qtype %q", f[4])
		}
		if e.Rcode, ok = dns.StringToRcode[f[5]]; !ok {
			return nil, fmt.Errorf("rcode %q", f[5])
		}
		if e.Verdict == 0 {
			return nil, fmt.Errorf("verdict %q", f[6])
		}
		if e.Held, err = time.ParseDuration(f[7]); err != nil {
			return nil, err
		}
		if len(f) == 9 {
			for a := range strings.SplitSeq(f[8], ",") {
				addr, err := netip.ParseAddr(a)
				if err != nil {
					return nil, err
				}
				e.Addresses = append(e.Addresses, addr)
			}
		}
		out = append(out, e)
	}
	return out, nil
}
