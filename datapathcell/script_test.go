// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/agenttest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestPrivilegedScript runs the datapath scenarios (testdata/*.txtar) with
// the agent's whole control plane over real pinned maps in a private bpffs
// mount, restarting the agent inside the scripts. Beside the agenttest
// commands, test/map-check compares a pinned map with its desired table.
// It runs in a network namespace of its own, which has no address: the
// host's addresses (the node cell's) would be in the maps and tables the
// scripts compare, and take identity numbers.
func TestPrivilegedScript(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	if !netnstest.InFreshProcessNetns(t, "ipca-dpscript", false) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	scripttest.Test(t, ctx, func(t testing.TB, args []string) *script.Engine {
		return agenttest.NewEngine(t, args, func(extra ...cell.Cell) *hive.Hive {
			return cells.NewHive(append([]cell.Cell{cells.ControlPlane, mapCheckCell}, extra...)...)
		})
	}, nil, "testdata/*.txtar")
}

// mapCheckCell provides test/map-check.
var mapCheckCell = cell.Provide(func(db *statedb.DB, cfg datapathcell.Config, d *datapathcell.Datapath,
	entries statedb.Table[*ipcachecell.Entry], policies statedb.Table[*policy.Entry]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"test/map-check":      mapCheckCmd(db, cfg.BPFRoot, d, entries, policies),
		"test/bpf-enforced":   bpfEnforcedCmd(cfg.BPFRoot),
		"test/bpf-policy-put": bpfPolicyPutCmd(cfg.BPFRoot),
	})
})

// bpfPolicyPutCmd writes an entry into the pinned policy map directly,
// behind the writer's back.
func bpfPolicyPutCmd(bpfRoot string) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Write an entry into the pinned policy map directly", Args: "identity ingress|egress protocol port verdict"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 5 {
				return nil, script.ErrUsage
			}
			id, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil {
				return nil, err
			}
			dir, err := policy.ParseDirection(args[1])
			if err != nil {
				return nil, err
			}
			proto, err := policy.ParseProtocol(args[2])
			if err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(args[3], 10, 16)
			if err != nil {
				return nil, err
			}
			verdict, err := strconv.ParseUint(args[4], 10, 32)
			if err != nil {
				return nil, err
			}
			outer, err := ebpf.LoadPinnedMap(filepath.Join(bpfmaps.PinDir(bpfRoot), bpfmaps.PolicyName), nil)
			if err != nil {
				return nil, err
			}
			defer outer.Close()
			m, err := bpfmaps.PolicyOf(outer, 0) // the host-wide default's
			if err != nil {
				return nil, err
			}
			defer m.Close()
			// Port 0 of a protocol is every port, as rules without ports are.
			key := policy.Key{Identity: identity.Number(id), Direction: policy.Direction(dir),
				Protocol: policy.Protocol(proto), Port: uint16(port)}
			if proto != 0 && port == 0 {
				key.PortWildcardBits = 16
			}
			k := bpfmaps.NewPolicyKey(key)
			v := bpfmaps.NewPolicyValue(uint32(verdict))
			return nil, m.Put(&k, &v)
		})
}

// bpfEnforcedCmd waits until the pinned enforcement map enforces the
// given directions and no other: the enforcement writer switches a
// direction on only after both map writers have written, so a script
// that asserts what the maps do waits for it.
func bpfEnforcedCmd(bpfRoot string) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Wait until the pinned enforcement map enforces exactly the given directions",
			Args:    "[ingress] [egress]",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			var want [2]bool
			for _, arg := range args {
				dir, err := policy.ParseDirection(arg)
				if err != nil {
					return nil, err
				}
				want[dir] = true
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				got, err := bpfmaps.ReadEnforcement(bpfRoot)
				if err == nil && got == want {
					return nil, nil
				}
				if time.Now().After(deadline) {
					return nil, fmt.Errorf("enforcement map: %v (err %v), want %v", got, err, want)
				}
				select {
				case <-s.Context().Done():
					return nil, s.Context().Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
}

// desiredRow is a row of a desired table, as the map would hold it.
type desiredRow struct {
	key, value string
	status     reconciler.StatusKind
	err        string
}

// mapCheck is what a pinned map holds against its desired table.
type mapCheck struct {
	done, errored, pending int
	// problems are the ways the map disagrees with the rows' statuses.
	problems []string
}

// compare checks that the map holds exactly the rows whose status is Done,
// with their values, and none of the rows whose status is Error.
func compare(rows []desiredRow, pinned map[string]string) mapCheck {
	var c mapCheck
	want := map[string]bool{}
	for _, row := range rows {
		got, inMap := pinned[row.key]
		switch row.status {
		case reconciler.StatusKindDone:
			c.done++
			want[row.key] = true
			if got != row.value {
				c.problems = append(c.problems, fmt.Sprintf("%s is Done but the map has %q, want %q", row.key, got, row.value))
			}
		case reconciler.StatusKindError:
			c.errored++
			if inMap && got == row.value {
				c.problems = append(c.problems, fmt.Sprintf("%s is in the map but its status is Error: %s", row.key, row.err))
			}
		default:
			c.pending++
		}
	}
	for _, k := range slices.Sorted(maps.Keys(pinned)) {
		if !want[k] {
			c.problems = append(c.problems, fmt.Sprintf("%s is in the map but no row is Done for it", k))
		}
	}
	return c
}

// mapCheckCmd waits until a pinned map holds exactly the rows of its
// desired table whose status is Done (with their values), none whose
// status is Error, nothing else, and the counts of Done and Error rows are
// the given ones.
func mapCheckCmd(db *statedb.DB, bpfRoot string, d *datapathcell.Datapath, entries statedb.Table[*ipcachecell.Entry],
	policies statedb.Table[*policy.Entry]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Wait until a pinned map holds exactly the Done rows of its table, and count Done and Error rows",
			Args:    "ipcache|policy done=N error=N",
			Flags: func(fs *pflag.FlagSet) {
				fs.Duration("timeout", 20*time.Second, "How long to wait")
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 3 {
				return nil, script.ErrUsage
			}
			wantDone, err1 := strconv.Atoi(strings.TrimPrefix(args[1], "done="))
			wantErrors, err2 := strconv.Atoi(strings.TrimPrefix(args[2], "error="))
			if err1 != nil || err2 != nil {
				return nil, script.ErrUsage
			}
			var read func() ([]desiredRow, map[string]string, error)
			// guarded counts the policy map's keys that the deny guard
			// holds as deny: each is taken as what it stands for.
			guarded := 0
			switch args[0] {
			case "ipcache":
				read = func() ([]desiredRow, map[string]string, error) {
					var rows []desiredRow
					for e, rev := range entries.All(db.ReadTxn()) {
						kind, err := d.IPCacheStatus(rev)
						errText := ""
						if err != nil {
							errText = err.Error()
						}
						rows = append(rows, desiredRow{e.Prefix().String(), strconv.FormatUint(uint64(e.Identity), 10), kind, errText})
					}
					m, err := bpfmaps.ReadIPCache(bpfRoot)
					pinned := map[string]string{}
					for p, id := range m {
						pinned[p.String()] = strconv.FormatUint(uint64(id), 10)
					}
					return rows, pinned, err
				}
			case "policy":
				read = func() ([]desiredRow, map[string]string, error) {
					var rows []desiredRow
					for e := range policies.All(db.ReadTxn()) {
						k := e.Key
						key := fmt.Sprintf("%d/%d/%d/%d", k.Identity, k.Direction, k.Protocol, k.Port)
						rows = append(rows, desiredRow{key, strconv.FormatUint(uint64(e.Verdict), 10), e.Status.Kind, e.Status.GetError()})
					}
					m, err := bpfmaps.ReadPolicy(bpfRoot)
					pinned := map[string]string{}
					for k, verdict := range m {
						id, dir, proto, port := k.Fields()
						pinned[fmt.Sprintf("%d/%d/%d/%d", id, dir, proto, port)] = strconv.FormatUint(uint64(verdict), 10)
					}
					guard := d.DenyGuard()
					guarded = len(guard)
					for k, how := range guard {
						key := fmt.Sprintf("%d/%d/%d/%d", k.Identity, k.Direction, k.Protocol, k.Port)
						if how == "shadow" {
							delete(pinned, key)
						} else {
							pinned[key] = strconv.FormatUint(uint64(policy.VerdictAllow), 10)
						}
					}
					return rows, pinned, err
				}
			default:
				return nil, script.ErrUsage
			}
			timeout, _ := s.Flags.GetDuration("timeout")
			deadline := time.Now().Add(timeout)
			for {
				rows, pinned, err := read()
				c := compare(rows, pinned)
				if err == nil && len(c.problems) == 0 && c.pending == 0 && c.done == wantDone && c.errored == wantErrors {
					out := fmt.Sprintf("done=%d error=%d map=%d", c.done, c.errored, len(pinned))
					if guarded > 0 {
						out += fmt.Sprintf(" guarded=%d", guarded)
					}
					return scriptcmd.Result(out+"\n", nil)
				}
				if time.Now().After(deadline) {
					return scriptcmd.Result("", fmt.Errorf("%s: done=%d error=%d pending=%d map=%d (err %v), want done=%d error=%d; problems: %s",
						args[0], c.done, c.errored, c.pending, len(pinned), err, wantDone, wantErrors, strings.Join(c.problems, "; ")))
				}
				select {
				case <-s.Context().Done():
					return nil, s.Context().Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
}
