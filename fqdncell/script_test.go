// SPDX-License-Identifier: Apache-2.0

package fqdncell_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/miekg/dns"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/fqdncell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/ipcachetest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/jsoncmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

func TestScript(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, newScriptEngine, nil, "testdata/*.txtar")
}

// fakeDatapath records the proxy's port. WaitIPCacheWritten returns once
// the policy entries of the identities in the tables are computed, as the
// real datapath writes an ipcache entry only after its identity's policy
// entries; it blocks while the script holds the writer
// (test/hold-writes), as a slow datapath.
type fakeDatapath struct {
	mu       sync.Mutex
	port     uint16
	blocked  chan struct{} // nil: not held
	db       *statedb.DB
	progress policy.Progress
}

func (d *fakeDatapath) WaitIPCacheWritten(ctx context.Context, _ statedb.Revision) error {
	d.mu.Lock()
	blocked, db, progress := d.blocked, d.db, d.progress
	d.mu.Unlock()
	if _, err := progress.WaitComputed(ctx, db.ReadTxn()); err != nil {
		return err
	}
	if blocked == nil {
		return nil
	}
	select {
	case <-blocked:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DNSAnswers: the scripts hand recorded answers to the cell themselves
// (fqdn/recorded).
func (d *fakeDatapath) DNSAnswers() (*ebpf.Map, error) {
	return nil, errors.New("no ring in the scripts")
}

func (d *fakeDatapath) SetDNSProxyPort(port uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.port = port
	return nil
}

// fakeProxy stands in for the proxy: the scripts call the cell's hooks
// themselves, and the host's sockets and routes stay untouched.
type fakeProxy struct{ port uint16 }

func (p fakeProxy) Port() uint16          { return p.port }
func (p fakeProxy) Stats() dnsproxy.Stats { return dnsproxy.Stats{} }
func (p fakeProxy) Close() error          { return nil }

// testServer is the DNS server the scripts' queries were sent to.
var testServer = netip.MustParseAddrPort("192.0.2.53:53")

// policyMapConfig stands in for the datapath's --policy-map-max-entries.
type policyMapConfig struct{ PolicyMapMaxEntries uint32 }

func (def policyMapConfig) Flags(flags *pflag.FlagSet) {
	flags.Uint32("policy-map-max-entries", def.PolicyMapMaxEntries, "Maximum entries of the policy map")
}

// newScriptEngine builds a hive of the identity, ipcache, policy and fqdn
// cells over a policy and a state directory, with a fake datapath and
// proxy; test/restart replaces it with a new one over the same
// directories.
func newScriptEngine(t testing.TB, args []string) *script.Engine {
	policyDir, stateDir := t.TempDir(), t.TempDir()
	log := hivetest.Logger(t)
	dp := &fakeDatapath{}
	var (
		h        *hive.Hive
		hiveCmds map[string]script.Cmd
		names    *fqdncell.Names
		ipc      *ipcachecell.IPCache
		alloc    *identitycell.Allocator
		sdb      *statedb.DB
	)
	build := func() {
		h = cells.NewHive(
			identitycell.Cell,
			ipcachecell.Cell,
			policycell.Cell,
			fqdncell.Cell,
			cell.Config(policyMapConfig{PolicyMapMaxEntries: policycell.DefaultPolicyMapMaxEntries}),
			cell.Provide(
				func(c policyMapConfig) policy.MapCapacity { return policy.MapCapacity(c.PolicyMapMaxEntries) },
				func() dnsproxy.Datapath { return dp },
				endpoint.NewTable, statedb.RWTable[*endpoint.State].ToTable,
			),
			cell.Invoke(func(n *fqdncell.Names, c *ipcachecell.IPCache, db *statedb.DB, progress policy.Progress,
				a *identitycell.Allocator) {
				names, ipc, alloc, sdb = n, c, a, db
				dp.mu.Lock()
				dp.db, dp.progress = db, progress
				dp.mu.Unlock()
				n.StubHost(func(dnsproxy.Config) (fqdncell.ProxyServer, error) { return fakeProxy{port: 10053}, nil })
			}),
		)
		flags := pflag.NewFlagSet("", pflag.ContinueOnError)
		h.RegisterFlags(flags)
		require.NoError(t, flags.Set("state-dir", stateDir))
		require.NoError(t, flags.Set("policy-dir", policyDir))
		require.NoError(t, flags.Parse(args))
		var err error
		hiveCmds, err = h.ScriptCommands(log)
		require.NoError(t, err)
	}
	build()
	t.Cleanup(func() { h.Stop(log, context.Background()) })

	cmds := map[string]script.Cmd{}
	for name := range hiveCmds {
		cmds[name] = currentHiveCmd{name: name, cmds: &hiveCmds}
	}
	maps.Copy(cmds, script.DefaultCmds())
	maps.Copy(cmds, jsoncmd.Commands())
	maps.Copy(cmds, ipcachetest.OwnerCommands(func() *ipcachecell.IPCache { return ipc }))
	cmds["test/policy-write"] = script.Command(
		script.CmdUsage{Summary: "Write a script file into the policy directory", Args: "name file"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			data, err := os.ReadFile(s.Path(args[1]))
			if err != nil {
				return nil, err
			}
			tmp := filepath.Join(policyDir, ".tmp-"+args[0])
			if err := os.WriteFile(tmp, data, 0o644); err != nil {
				return nil, err
			}
			return nil, os.Rename(tmp, filepath.Join(policyDir, args[0]))
		})
	cmds["test/policy-remove"] = script.Command(
		script.CmdUsage{Summary: "Remove a file of the policy directory", Args: "name"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			return nil, os.Remove(filepath.Join(policyDir, args[0]))
		})
	cmds["test/state-cat"] = script.Command(
		script.CmdUsage{Summary: "Print a file of the state directory", Args: "name"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			data, err := os.ReadFile(filepath.Join(stateDir, args[0]))
			return scriptcmd.Result(string(data), err)
		})
	cmds["test/state-write"] = script.Command(
		script.CmdUsage{Summary: "Write a script file into the state directory", Args: "name file"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			data, err := os.ReadFile(s.Path(args[1]))
			if err != nil {
				return nil, err
			}
			return nil, os.WriteFile(filepath.Join(stateDir, args[0]), data, 0o600)
		})
	cmds["test/restart"] = script.Command(
		script.CmdUsage{Summary: "Stop the hive and start a new one over the same directories"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if err := h.Stop(log, context.Background()); err != nil {
				return nil, err
			}
			build()
			return nil, h.Start(log, context.Background())
		})
	cmds["test/proxy-port"] = script.Command(
		script.CmdUsage{Summary: "Wait (up to 10s) until the cell told the datapath the port", Args: "port"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			var got string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				dp.mu.Lock()
				got = strconv.Itoa(int(dp.port))
				dp.mu.Unlock()
				if got == args[0] {
					return nil, nil
				}
			}
			return nil, fmt.Errorf("proxy port %s, want %s", got, args[0])
		})
	cmds["test/hold-writes"] = script.Command(
		script.CmdUsage{Summary: "Make the datapath's ipcache writes wait (on) or go (off)", Args: "on|off"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			dp.mu.Lock()
			defer dp.mu.Unlock()
			switch {
			case args[0] == "on" && dp.blocked == nil:
				dp.blocked = make(chan struct{})
			case args[0] == "off" && dp.blocked != nil:
				close(dp.blocked)
				dp.blocked = nil
			}
			return nil, nil
		})
	cmds["test/wait-labels"] = script.Command(
		script.CmdUsage{Summary: "Wait (up to 10s) until a learned address's identity has these labels", Args: "addr labels"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return nil, err
			}
			var got string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				for _, e := range names.Entries() {
					if e.Address == addr {
						l, _ := alloc.LabelsTxn(sdb.ReadTxn(), e.Identity)
						got = l.String()
					}
				}
				if got == args[1] {
					return nil, nil
				}
			}
			return nil, fmt.Errorf("labels of %s: %q, want %q", addr, got, args[1])
		})
	cmds["fqdn/allow"] = script.Command(
		script.CmdUsage{Summary: "Ask the proxy's Allow whether a client may resolve a name", Args: "client name"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			client, err := netip.ParseAddr(args[0])
			if err != nil {
				return nil, err
			}
			verdict := "refused"
			if names.Allow(netip.AddrPortFrom(client, 40000), testServer, args[1]+".") {
				verdict = "allowed"
			}
			return scriptcmd.Result(verdict+"\n", nil)
		})
	cmds["fqdn/recorded"] = script.Command(
		script.CmdUsage{
			Summary: "Hand the cell an answer the program recorded (it bypassed the proxy)",
			Args:    "client name addr[,addr...]",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 3 {
				return nil, script.ErrUsage
			}
			msg, err := answerMsg(args[1], args[2], 60, "")
			if err != nil {
				return nil, err
			}
			payload, err := msg.Pack()
			if err != nil {
				return nil, err
			}
			client, err := netip.ParseAddr(args[0])
			if err != nil {
				return nil, err
			}
			// The record's layout (bpfmaps.DecodeDNSAnswer): family, pad,
			// length, ifindex, pad, endpoint, server, payload.
			raw := make([]byte, bpfmaps.DNSAnswerRecordSize)
			raw[0] = 1
			binary.NativeEndian.PutUint32(raw[4:], uint32(len(payload)))
			a4 := client.As4()
			copy(raw[16:], a4[:])
			s4 := testServer.Addr().As4()
			copy(raw[32:], s4[:])
			copy(raw[48:], payload)
			learned := "skipped"
			if names.LearnRecorded(raw) {
				learned = "learned"
			}
			return scriptcmd.Result(learned+"\n", nil)
		})
	cmds["fqdn/answer"] = script.Command(
		script.CmdUsage{
			Summary: "Hand the cell an answer as the proxy would, and wait for its release",
			Args:    "client name addr[,addr...] [ttl=N] [cname=target]",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 3 {
				return nil, script.ErrUsage
			}
			client, err := netip.ParseAddr(args[0])
			if err != nil {
				return nil, err
			}
			ttl, cname := uint32(60), ""
			for _, arg := range args[3:] {
				key, value, _ := strings.Cut(arg, "=")
				switch key {
				case "ttl":
					n, err := strconv.ParseUint(value, 10, 32)
					if err != nil {
						return nil, err
					}
					ttl = uint32(n)
				case "cname":
					cname = value
				default:
					return nil, fmt.Errorf("unknown argument %q", arg)
				}
			}
			msg, err := answerMsg(args[1], args[2], ttl, cname)
			if err != nil {
				return nil, err
			}
			ctx, cancel := context.WithTimeout(context.Background(), names.MaxDelay())
			defer cancel()
			names.OnAnswer(ctx, netip.AddrPortFrom(client, 40000), testServer, msg)
			held := "released"
			if ctx.Err() != nil {
				held = "released after the max delay"
			}
			return scriptcmd.Result(held+"\n", nil)
		})
	cmds["fqdn/gc"] = script.Command(
		script.CmdUsage{Summary: "Run a collection round of expired names"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			return scriptcmd.Result("", names.GC(context.Background()))
		})
	return &script.Engine{Cmds: cmds}
}

// currentHiveCmd runs the command of that name of the current hive.
type currentHiveCmd struct {
	name string
	cmds *map[string]script.Cmd
}

func (c currentHiveCmd) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	return (*c.cmds)[c.name].Run(s, args...)
}

func (c currentHiveCmd) Usage() *script.CmdUsage { return (*c.cmds)[c.name].Usage() }

// answerMsg is the answer to an A query of name: the addresses (A or
// AAAA), under cname if set (name a CNAME of it), each with ttl.
func answerMsg(name, addrs string, ttl uint32, cname string) (*dns.Msg, error) {
	owner := dns.Fqdn(name)
	msg := new(dns.Msg)
	msg.SetQuestion(owner, dns.TypeA)
	msg.Response = true
	if cname != "" {
		rr, err := dns.NewRR(fmt.Sprintf("%s %d IN CNAME %s", owner, ttl, dns.Fqdn(cname)))
		if err != nil {
			return nil, err
		}
		msg.Answer = append(msg.Answer, rr)
		owner = dns.Fqdn(cname)
	}
	for a := range strings.SplitSeq(addrs, ",") {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			return nil, err
		}
		kind := "A"
		if addr.Is6() {
			kind = "AAAA"
		}
		rr, err := dns.NewRR(fmt.Sprintf("%s %d IN %s %s", owner, ttl, kind, addr))
		if err != nil {
			return nil, err
		}
		msg.Answer = append(msg.Answer, rr)
	}
	return msg, nil
}
