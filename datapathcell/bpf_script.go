// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// defaultBPFListLimit is how many rows bpf/ipcache and bpf/policy print
// unless --limit says otherwise: the output is built in memory, and the
// shell bounds what its commands may hold (docs/FAULTS.md).
const defaultBPFListLimit = 10000

func bpfScriptCommands(db *statedb.DB, d *Datapath, ipcache statedb.Table[*ipcachecell.Entry],
	pol statedb.Table[*policy.Entry]) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"bpf/ipcache": bpfIPCacheCommand(db, d, ipcache),
		"bpf/policy":  bpfPolicyCommand(db, d, pol),
	})
}

// pinnedMap returns a duplicate of the descriptor of the pinned map that
// which picks, for the caller to read and close, so that a long read
// neither holds the datapath's lock (which the writers take) nor reads a
// map that stop closed.
//
// Possible errors: ErrMapsNotOpen before start or after stop.
func (d *Datapath) pinnedMap(which func(*bpfmaps.Pinned) *ebpf.Map) (*ebpf.Map, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.maps == nil || which(d.maps) == nil {
		return nil, ErrMapsNotOpen
	}
	return which(d.maps).Clone()
}

// pinnedPolicyMaps opens the policy maps of the host-wide default and of
// every subject the outer policy map holds, by subject; the caller closes
// them.
//
// Possible errors: ErrMapsNotOpen; the outer map cannot be read or an
// inner map opened.
func (d *Datapath) pinnedPolicyMaps() (map[identity.Number]*ebpf.Map, error) {
	def, err := d.pinnedMap(func(p *bpfmaps.Pinned) *ebpf.Map { return p.Policy })
	if err != nil {
		return nil, err
	}
	maps := map[identity.Number]*ebpf.Map{identity.Unknown: def}
	outer, err := d.pinnedMap(func(p *bpfmaps.Pinned) *ebpf.Map { return p.Policies })
	if errors.Is(err, ErrMapsNotOpen) {
		return maps, nil // fake maps: the default's only
	}
	if err != nil {
		def.Close()
		return nil, err
	}
	defer outer.Close()
	inner, err := pinnedSubjectPolicies(outer, nil)
	if err != nil {
		def.Close()
		return nil, err
	}
	for subject, p := range inner {
		maps[subject] = p.handle.(*ebpf.Map)
	}
	return maps, nil
}

func bpfListFlags(fs *pflag.FlagSet) {
	scriptcmd.OutputFlag(fs)
	fs.Bool("diff", false, "Print only the differences from the desired table; fail if there are any")
	fs.Int("limit", defaultBPFListLimit, "Print at most this many rows (the total is still counted)")
}

// bpfListing is what bpf/ipcache and bpf/policy print, as -o json shows it:
// the rows (map entries, or with --diff differences), how many there are in
// all, and whether rows were left out (--limit).
type bpfListing[R any] struct {
	Rows      []R  `json:"rows"`
	Total     int  `json:"total"`
	Truncated bool `json:"truncated"`
}

// result is the command's output: the read's error, else the listing as
// JSON or as the table text writes, with --diff's verdict as the error.
func (l *bpfListing[R]) result(mapName string, readErr error, o bpfOptions, text func(io.Writer)) (script.WaitFunc, error) {
	if readErr != nil {
		return scriptcmd.Result("", fmt.Errorf("read %s map: %w", mapName, readErr))
	}
	var differs error
	if o.diff {
		differs = differError(mapName, l.Total)
	}
	if o.json {
		return scriptcmd.JSON(l, differs)
	}
	var out strings.Builder
	w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
	text(w)
	w.Flush()
	if l.Truncated {
		fmt.Fprintf(&out, "(%d of %d rows shown; raise --limit for more)\n", len(l.Rows), l.Total)
	}
	return scriptcmd.Result(out.String(), differs)
}

func (l *bpfListing[R]) add(r R, limit int) {
	l.Total++
	if len(l.Rows) < limit {
		l.Rows = append(l.Rows, r)
	} else {
		l.Truncated = true
	}
}

// Differences between a pinned map and its desired table.
const (
	// diffMissing: in the desired table, not in the map.
	diffMissing = "missing"
	// diffExtra: in the map, not in the desired table.
	diffExtra = "extra"
	// diffDifferent: in both, with another value.
	diffDifferent = "different"
)

type bpfOptions struct {
	json, diff bool
	limit      int
}

func parseBPFOptions(s *script.State, args []string) (bpfOptions, error) {
	var o bpfOptions
	if len(args) != 0 {
		return o, script.ErrUsage
	}
	var err error
	if o.json, err = scriptcmd.JSONOutput(s); err != nil {
		return o, err
	}
	if o.diff, err = s.Flags.GetBool("diff"); err != nil {
		return o, err
	}
	if o.limit, err = s.Flags.GetInt("limit"); err != nil {
		return o, err
	}
	if o.limit < 0 {
		return o, fmt.Errorf("--limit %d: %w", o.limit, ErrNegativeLimit)
	}
	return o, nil
}

// diffMap compares a pinned map with its desired table without holding
// either whole: every map entry is looked up in the table (extra,
// different), then every desired key in the map (missing). Neither is a
// snapshot: an entry the writers change meanwhile may show as a
// difference.
func diffMap[K comparable, V comparable](m *ebpf.Map, desired func(K) (V, bool), all func(yield func(K, V) bool),
	emit func(kind string, k K, inMap, want V)) error {
	var zero V
	err := bpfmaps.ReadEntries(m, func(k K, v V) {
		want, found := desired(k)
		switch {
		case !found:
			emit(diffExtra, k, v, zero)
		case want != v:
			emit(diffDifferent, k, v, want)
		}
	})
	if err != nil {
		return err
	}
	var lookupErr error
	all(func(k K, want V) bool {
		var v V
		err := m.Lookup(k, &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			emit(diffMissing, k, zero, want)
			return true
		}
		lookupErr = err
		return err == nil
	})
	return lookupErr
}

// differError is the error of --diff when the map and table differ.
func differError(mapName string, n int) error {
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%s map: %d differences from the desired table: %w", mapName, n, ErrMapDiffers)
}

// ipcacheRowJSON is a row of bpf/ipcache -o json: a map entry, or with
// --diff a difference (identity is the map's, desiredIdentity the table's;
// 0 where there is none).
type ipcacheRowJSON struct {
	Difference string          `json:"difference,omitempty"`
	Prefix     string          `json:"prefix"`
	Identity   identity.Number `json:"identity"`
	// Source is the desired entry's; "" when the table has no entry for
	// the prefix (the map does not hold sources).
	Source          string           `json:"source"`
	DesiredIdentity *identity.Number `json:"desiredIdentity,omitempty"`
}

func bpfIPCacheCommand(db *statedb.DB, d *Datapath, table statedb.Table[*ipcachecell.Entry]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "List what the pinned ipcache map holds, or its differences from the ipcache table",
			Detail: []string{
				"Reads the pinned map itself: prefix, identity, and the source of the",
				"desired entry for that prefix (the map holds no source).",
				"--diff prints only the differences from the desired `ipcache` table:",
				"missing (desired, not in the map), extra (in the map, not desired),",
				"different (another identity), and then fails (exit status 1 through",
				"the shell) saying how many; no difference prints nothing and succeeds.",
				"An entry held back (ipcache status Error) is a difference until written.",
				"At most --limit rows are printed; the total is counted.",
				"-o json: one object {rows, total, truncated}; a row has prefix,",
				"identity, source, and with --diff difference and desiredIdentity.",
			},
			Flags: bpfListFlags,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			o, err := parseBPFOptions(s, args)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			m, err := d.pinnedMap(func(p *bpfmaps.Pinned) *ebpf.Map { return p.IPCache })
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("read ipcache map: %w", err))
			}
			defer m.Close()
			txn := db.ReadTxn()
			desired := func(k bpfmaps.IPCacheKey) (*ipcachecell.Entry, bool) {
				prefix, err := k.Prefix()
				if err != nil {
					return nil, false
				}
				e, _, found := table.Get(txn, ipcachecell.EntryIndex.Query(prefix))
				return e, found
			}
			prefixOf := func(k bpfmaps.IPCacheKey) string {
				if p, err := k.Prefix(); err == nil {
					return p.String()
				}
				return fmt.Sprintf("(not canonical: %x)", k[:])
			}
			listing := bpfListing[ipcacheRowJSON]{Rows: []ipcacheRowJSON{}}
			var readErr error
			if !o.diff {
				readErr = bpfmaps.ReadEntries(m, func(k bpfmaps.IPCacheKey, v bpfmaps.IPCacheValue) {
					row := ipcacheRowJSON{Prefix: prefixOf(k), Identity: v.Identity()}
					if e, found := desired(k); found {
						row.Source = e.Source.String()
					}
					listing.add(row, o.limit)
				})
			} else {
				readErr = diffMap(m,
					func(k bpfmaps.IPCacheKey) (bpfmaps.IPCacheValue, bool) {
						e, found := desired(k)
						if !found {
							return bpfmaps.IPCacheValue{}, false
						}
						return bpfmaps.NewIPCacheValue(e.Identity), true
					},
					func(yield func(bpfmaps.IPCacheKey, bpfmaps.IPCacheValue) bool) {
						for e := range table.All(txn) {
							if !yield(bpfmaps.NewIPCacheKey(e.Prefix()), bpfmaps.NewIPCacheValue(e.Identity)) {
								return
							}
						}
					},
					func(kind string, k bpfmaps.IPCacheKey, inMap, want bpfmaps.IPCacheValue) {
						row := ipcacheRowJSON{Difference: kind, Prefix: prefixOf(k), Identity: inMap.Identity()}
						if kind != diffExtra {
							id := want.Identity()
							row.DesiredIdentity = &id
						}
						if e, found := desired(k); found {
							row.Source = e.Source.String()
						}
						listing.add(row, o.limit)
					})
			}
			return listing.result(bpfmaps.IPCacheName, readErr, o, func(w io.Writer) {
				if o.diff {
					if listing.Total > 0 {
						fmt.Fprintln(w, "Difference\tPrefix\tMap identity\tDesired identity\tSource")
					}
					for _, r := range listing.Rows {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Difference, r.Prefix, optional(r.Identity, r.Difference != diffMissing),
							optional(deref(r.DesiredIdentity), r.DesiredIdentity != nil), dash(r.Source))
					}
					return
				}
				fmt.Fprintln(w, "Prefix\tIdentity\tSource")
				for _, r := range listing.Rows {
					fmt.Fprintf(w, "%s\t%s\t%s\n", r.Prefix, identity.Number(r.Identity), dash(r.Source))
				}
			})
		})
}

// policyRowJSON is a row of bpf/policy -o json: a map entry, or with
// --diff a difference (verdict is the map's, desiredVerdict the table's;
// "" where there is none). port and portWildcardBits are the key's: its
// last portWildcardBits bits are any (16: every port of the protocol).
type policyRowJSON struct {
	Difference       string          `json:"difference,omitempty"`
	Subject          identity.Number `json:"subject"`
	Identity         identity.Number `json:"identity"`
	Direction        string          `json:"direction"`
	Protocol         string          `json:"protocol"`
	Port             uint16          `json:"port"`
	PortWildcardBits uint8           `json:"portWildcardBits,omitempty"`
	Verdict          string          `json:"verdict"`
	DesiredVerdict   string          `json:"desiredVerdict,omitempty"`
}

// policyRow is the row of key k. A key that is not canonical is shown as
// stored, with the wildcard bits its prefix length gives.
func policyRow(subject identity.Number, k bpfmaps.PolicyKey) policyRowJSON {
	id, dir, proto, port := k.Fields()
	row := policyRowJSON{Subject: subject, Identity: id, Direction: policy.Direction(dir).String(),
		Protocol: policy.Protocol(proto).String(), Port: port}
	if key, err := k.Key(); err == nil {
		row.PortWildcardBits = key.PortWildcardBits
	}
	return row
}

// ports is the row's port column: the port, the range its wildcard bits
// cover, or 0 for every port (and any protocol).
func (r policyRowJSON) ports() string {
	switch {
	case r.PortWildcardBits == 0:
		return strconv.Itoa(int(r.Port))
	case r.PortWildcardBits >= 16:
		return "0"
	}
	return fmt.Sprintf("%d-%d", r.Port, int(r.Port)|(1<<r.PortWildcardBits-1))
}

func bpfPolicyCommand(db *statedb.DB, d *Datapath, table statedb.Table[*policy.Entry]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "List what the pinned policy map holds, or its differences from the policy table",
			Detail: []string{
				"Reads the pinned map itself: identity, direction, protocol, port (0:",
				"any) and verdict of each entry.",
				"--diff prints only the differences from the desired `policy` table:",
				"missing, extra, different (another verdict), and then fails (exit",
				"status 1 through the shell) saying how many; no difference prints",
				"nothing and succeeds. An entry removed from the table stays in the",
				"map (extra) while the policy writer drains it, and one it could not",
				"write (a full map) is missing.",
				"At most --limit rows are printed; the total is counted.",
				"-o json: one object {rows, total, truncated}; a row has identity,",
				"direction, protocol, port, verdict, and with --diff difference and",
				"desiredVerdict.",
			},
			Flags: bpfListFlags,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			o, err := parseBPFOptions(s, args)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			bySubject, err := d.pinnedPolicyMaps()
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("read policy map: %w", err))
			}
			defer func() {
				for _, m := range bySubject {
					m.Close()
				}
			}()
			subjects := slices.Sorted(maps.Keys(bySubject))
			txn := db.ReadTxn()
			listing := bpfListing[policyRowJSON]{Rows: []policyRowJSON{}}
			var readErr error
			for _, subject := range subjects {
				// Every subject's entries that are no row's (extra) or
				// that another verdict (different); the rows then, for
				// what is missing.
				readErr = bpfmaps.ReadEntries(bySubject[subject], func(k bpfmaps.PolicyKey, v bpfmaps.PolicyValue) {
					row := policyRow(subject, k)
					row.Verdict = policy.Verdict(v.Verdict()).String()
					if !o.diff {
						listing.add(row, o.limit)
						return
					}
					// A key that is not canonical is no row's: extra.
					key, err := k.Key()
					var want *policy.Entry
					if err == nil {
						key.Subject = subject
						want, _, _ = table.Get(txn, policy.KeyIndex.Query(key))
					}
					switch {
					case want == nil:
						row.Difference = diffExtra
					case bpfmaps.NewPolicyValue(uint32(want.Verdict)) != v:
						row.Difference, row.DesiredVerdict = diffDifferent, want.Verdict.String()
					default:
						return
					}
					listing.add(row, o.limit)
				})
				if readErr != nil {
					break
				}
			}
			if o.diff && readErr == nil {
				for e := range table.All(txn) {
					k := bpfmaps.NewPolicyKey(e.Key)
					var v bpfmaps.PolicyValue
					m := bySubject[e.Key.Subject]
					if m != nil {
						err := m.Lookup(&k, &v)
						if err == nil {
							continue
						}
						if !errors.Is(err, ebpf.ErrKeyNotExist) {
							readErr = err
							break
						}
					}
					row := policyRow(e.Key.Subject, k)
					row.Difference, row.DesiredVerdict = diffMissing, e.Verdict.String()
					listing.add(row, o.limit)
				}
			}
			return listing.result(bpfmaps.PolicyName, readErr, o, func(w io.Writer) {
				if o.diff {
					if listing.Total > 0 {
						fmt.Fprintln(w, "Difference\tSubject\tIdentity\tDirection\tProtocol\tPort\tMap verdict\tDesired verdict")
					}
				} else {
					fmt.Fprintln(w, "Subject\tIdentity\tDirection\tProtocol\tPort\tVerdict")
				}
				for _, r := range listing.Rows {
					if o.diff {
						fmt.Fprintf(w, "%s\t", r.Difference)
					}
					fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s", r.Subject, r.Identity, r.Direction, r.Protocol, r.ports(), dash(r.Verdict))
					if o.diff {
						fmt.Fprintf(w, "\t%s", dash(r.DesiredVerdict))
					}
					fmt.Fprintln(w)
				}
			})
		})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func deref(p *identity.Number) identity.Number {
	if p == nil {
		return 0
	}
	return *p
}

func optional(id identity.Number, present bool) string {
	if !present {
		return "-"
	}
	return strconv.FormatUint(uint64(id), 10)
}
