// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// engineFixture is a selector engine on bare tables, driven by the test:
// it writes policies and identities directly and calls round.
type engineFixture struct {
	db          *statedb.DB
	policies    statedb.RWTable[*policy.Policy]
	identities  statedb.RWTable[*identitycell.Identity]
	entries     statedb.RWTable[*policy.Entry]
	enforcement statedb.RWTable[*policy.Enforcement]
	// endpoints is not the engine's until withEndpoints, dnsRules until
	// withDNSRules.
	endpoints statedb.RWTable[*endpoint.State]
	dnsRules  statedb.RWTable[*policy.DNSRules]
	engine    *selectorEngine

	// policiesRead and ipcacheResolved mark the `policies` and `ipcache`
	// tables initialized.
	policiesRead, ipcacheResolved func()
}

func newEngineFixture(tb testing.TB) *engineFixture {
	tb.Helper()
	f := &engineFixture{db: statedb.New()}
	var err error
	f.policies, err = newPoliciesTable(f.db)
	require.NoError(tb, err)
	f.identities, err = identitycell.NewIdentitiesTable(f.db)
	require.NoError(tb, err)
	ipcache, err := ipcachecell.NewEntriesTable(f.db)
	require.NoError(tb, err)
	f.entries, err = policy.NewEntryTable(f.db)
	require.NoError(tb, err)
	f.enforcement, err = policy.NewEnforcementTable(f.db)
	require.NoError(tb, err)
	f.endpoints, err = endpoint.NewTable(f.db)
	require.NoError(tb, err)
	f.dnsRules, err = policy.NewDNSRulesTable(f.db)
	require.NoError(tb, err)
	require.NoError(tb, f.db.Start())
	tb.Cleanup(func() { require.NoError(tb, f.db.Stop()) })
	f.policiesRead = registerInitializer(f.db, f.policies)
	f.ipcacheResolved = registerInitializer(f.db, ipcache)
	f.engine = newSelectorEngine(f.db, f.policies, f.identities, ipcache, f.entries, f.enforcement,
		newSelectorProgress(f.db, f.policies, f.identities), hivetest.Logger(tb), EnablePolicyDefault)
	return f
}

func registerInitializer[Obj any](db *statedb.DB, table statedb.RWTable[Obj]) func() {
	txn := db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "test")
	txn.Commit()
	return func() {
		txn := db.WriteTxn(table)
		done(txn)
		txn.Commit()
	}
}

func (f *engineFixture) initialized() bool {
	txn := f.db.ReadTxn()
	entries, _ := f.entries.Initialized(txn)
	enforcement, _ := f.enforcement.Initialized(txn)
	return entries && enforcement
}

func (f *engineFixture) round(tb testing.TB) {
	tb.Helper()
	_, err := f.engine.round()
	require.NoError(tb, err)
}

func (f *engineFixture) upsertPolicies(tb testing.TB, policies ...*policy.Policy) {
	tb.Helper()
	txn := f.db.WriteTxn(f.policies)
	for _, p := range policies {
		_, _, err := f.policies.Insert(txn, p)
		require.NoError(tb, err)
	}
	txn.Commit()
}

func (f *engineFixture) deletePolicy(tb testing.TB, p *policy.Policy) {
	tb.Helper()
	txn := f.db.WriteTxn(f.policies)
	_, _, err := f.policies.Delete(txn, p)
	require.NoError(tb, err)
	txn.Commit()
}

func (f *engineFixture) upsertIdentities(tb testing.TB, identities ...*identitycell.Identity) {
	tb.Helper()
	txn := f.db.WriteTxn(f.identities)
	for _, i := range identities {
		_, _, err := f.identities.Insert(txn, i)
		require.NoError(tb, err)
	}
	txn.Commit()
}

func (f *engineFixture) deleteIdentity(tb testing.TB, i *identitycell.Identity) {
	tb.Helper()
	txn := f.db.WriteTxn(f.identities)
	_, _, err := f.identities.Delete(txn, i)
	require.NoError(tb, err)
	txn.Commit()
}

// table returns the `policy` table as key -> policies.
func (f *engineFixture) table() map[policy.Key]string {
	out := map[policy.Key]string{}
	for e := range f.entries.All(f.db.ReadTxn()) {
		out[e.Key] = strings.Join(e.Policies, ",")
		switch e.Verdict {
		case policy.VerdictDeny:
			out[e.Key] = "deny:" + out[e.Key]
		case policy.VerdictDNSProxy:
			out[e.Key] = "dns-proxy:" + out[e.Key]
		}
	}
	return out
}

func identityRow(id identity.Number, lbls ...string) *identitycell.Identity {
	l, err := labels.New(lbls...)
	if err != nil {
		panic(err)
	}
	return identitycell.NewIdentity(id, l, 1, false)
}

func cidrPolicy(name string, dir policy.Direction, ports []policy.PortRange, cidrs ...string) *policy.Policy {
	rule := policy.Rule{Ports: ports}
	for _, c := range cidrs {
		rule.Peers = append(rule.Peers, policy.CIDRSelector{CIDR: netip.MustParsePrefix(c)})
	}
	p := &policy.Policy{Name: name, File: name + ".yaml", Line: 1}
	if dir == policy.Ingress {
		p.Ingress = []policy.Rule{rule}
	} else {
		p.Egress = []policy.Rule{rule}
	}
	return p
}

// bruteForce computes the desired table from scratch: every identity (and
// world) against every selector.
func bruteForce(policies []*policy.Policy, identities []*identitycell.Identity) map[policy.Key]string {
	type target struct {
		id       identity.Number
		prefixes []netip.Prefix
		labels   labels.Labels
	}
	targets := []target{{id: 0}, {id: identity.World, prefixes: policy.WorldPrefixes()}}
	for _, id := range []identity.Number{1, 3, 4, 5, 6, 7, 8} {
		targets = append(targets, target{id: id})
	}
	for _, i := range identities {
		targets = append(targets, target{i.ID, slices.Collect(i.Labels.Prefixes()), i.Labels})
	}
	// The policies of each key, by verdict.
	granted := map[policy.Key]map[policy.Verdict]map[string]struct{}{}
	grant := func(k policy.Key, v policy.Verdict, pol string) {
		if granted[k] == nil {
			granted[k] = map[policy.Verdict]map[string]struct{}{}
		}
		if granted[k][v] == nil {
			granted[k][v] = map[string]struct{}{}
		}
		granted[k][v][pol] = struct{}{}
	}
	for _, t := range targets {
		for _, p := range policies {
			for _, dir := range policy.Directions() {
				for _, rule := range p.Rules(dir) {
					selects := t.id == 0 && rule.AnyPeer
					for _, peer := range rule.Peers {
						selects = selects || t.id != 0 && peer.Selects(t.prefixes)
					}
					kv := endpoint.KeyValues(t.labels)
					for _, sel := range rule.Endpoints {
						_, isEndpoint := kv[policy.NamespaceLabel]
						selects = selects || isEndpoint && sel.Matches(kv)
					}
					for _, entity := range rule.Entities {
						selects = selects || bruteEntity(entity, t.id, t.labels)
					}
					if rule.FQDN != nil {
						for _, sel := range rule.FQDN.Selectors {
							selects = selects || t.labels.Has(sel.Label())
						}
					}
					if !selects {
						continue
					}
					v := policy.VerdictAllow
					if rule.Deny {
						v = policy.VerdictDeny
					}
					k := policy.Key{Identity: t.id, Direction: dir}
					if len(rule.Ports) == 0 {
						grant(k, v, p.Name)
					}
					for _, pp := range rule.Ports {
						pv := v
						if rule.FQDN != nil && dir == policy.Egress && !rule.Deny {
							for _, dns := range rule.FQDN.DNS {
								if slices.Contains(dns.Ports, pp) {
									pv = policy.VerdictDNSProxy
								}
							}
						}
						for _, block := range pp.AppendKeys(nil, k) {
							grant(block, pv, p.Name)
						}
					}
				}
			}
		}
	}
	// What a key matches: a protocol (0 any) and a port interval.
	span := func(k policy.Key) (policy.Protocol, uint32, uint32) {
		if k.Protocol == policy.ProtocolAny {
			return policy.ProtocolAny, 0, 65535
		}
		return k.Protocol, uint32(k.Port), uint32(k.Port) + 1<<k.PortWildcardBits - 1
	}
	out := map[policy.Key]string{}
	for k, verdicts := range granted {
		if names, denied := verdicts[policy.VerdictDeny]; denied {
			out[k] = "deny:" + strings.Join(slices.Sorted(maps.Keys(names)), ",")
			continue
		}
		covered := false
		protocol, lo, hi := span(k)
		for d, dv := range granted {
			if _, denied := dv[policy.VerdictDeny]; !denied || d.Identity != k.Identity || d.Direction != k.Direction {
				continue
			}
			dp, dlo, dhi := span(d)
			covered = covered || dp == policy.ProtocolAny || dp == protocol && dlo <= lo && hi <= dhi
		}
		switch proxied, ok := verdicts[policy.VerdictDNSProxy]; {
		case covered:
		case ok:
			out[k] = "dns-proxy:" + strings.Join(slices.Sorted(maps.Keys(proxied)), ",")
		default:
			out[k] = strings.Join(slices.Sorted(maps.Keys(verdicts[policy.VerdictAllow])), ",")
		}
	}
	return out
}

// bruteEntity is what an entity selects, as DESIGN.md section 11 and
// Cilium define it: its reserved number or its reserved label; cluster
// every endpoint identity (a namespace label) and the cluster's entities.
func bruteEntity(entity identity.Entity, id identity.Number, l labels.Labels) bool {
	numbers := map[identity.Entity]identity.Number{"host": 1, "unmanaged": 3, "health": 4, "init": 5,
		"remote-node": 6, "kube-apiserver": 7, "ingress": 8}
	if entity == "cluster" {
		if _, ok := endpoint.KeyValues(l)[policy.NamespaceLabel]; ok {
			return true
		}
		for _, member := range []identity.Entity{"host", "remote-node", "init", "ingress", "health", "unmanaged"} {
			if bruteEntity(member, id, l) {
				return true
			}
		}
		return false
	}
	return numbers[entity] == id || l.Has("reserved:"+string(entity))
}

func TestSelectorBasics(t *testing.T) {
	f := newEngineFixture(t)
	web := cidrPolicy("web", policy.Egress, []policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}}, "10.0.0.0/8")
	web.Egress[0].Peers[0].Except = []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}
	all := cidrPolicy("all", policy.Ingress, nil, "0.0.0.0/0")
	f.upsertPolicies(t, web, all)
	f.upsertIdentities(t,
		identityRow(16777217, "cidr:10.0.0.0/8"),
		identityRow(16777218, "cidr:10.1.0.0/16", "app:x"), // narrower, other labels too
		identityRow(16777219, "cidr:10.2.3.0/24"),          // inside the except prefix
		identityRow(16777220, "cidr:192.0.2.0/24"),
		identityRow(16777221, "app:no-cidr"),
	)
	f.round(t)
	require.Equal(t, map[policy.Key]string{
		{Identity: 2, Direction: policy.Ingress, Protocol: 0, Port: 0}:                          "all",
		{Identity: 16777217, Direction: policy.Ingress, Protocol: 0, Port: 0}:                   "all",
		{Identity: 16777217, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443}: "web",
		{Identity: 16777218, Direction: policy.Ingress, Protocol: 0, Port: 0}:                   "all",
		{Identity: 16777218, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443}: "web",
		{Identity: 16777219, Direction: policy.Ingress, Protocol: 0, Port: 0}:                   "all",
		{Identity: 16777220, Direction: policy.Ingress, Protocol: 0, Port: 0}:                   "all",
	}, f.table())
}

// TestSelectorInitialization: the tables are initialized in the first
// round that sees both the policies (the directory read) and the ipcache
// (every producer's prefixes resolved) initialized, having processed
// everything up to then.
func TestSelectorInitialization(t *testing.T) {
	f := newEngineFixture(t)
	f.round(t)
	require.False(t, f.initialized())

	f.upsertPolicies(t, cidrPolicy("web", policy.Egress, nil, "10.0.0.0/8"))
	f.policiesRead()
	f.round(t)
	require.False(t, f.initialized(), "the ipcache has not resolved the policy's prefixes yet")

	f.upsertIdentities(t, identityRow(16777217, "cidr:10.0.0.0/8"))
	f.ipcacheResolved()
	f.round(t)
	require.True(t, f.initialized())
	require.Equal(t, map[policy.Key]string{{Identity: 16777217, Direction: policy.Egress, Protocol: 0, Port: 0}: "web"}, f.table(),
		"what the ipcache had resolved is in the table when it is initialized")
}

func TestSelectorEnforcementRows(t *testing.T) {
	f := newEngineFixture(t)
	enforced := func() map[policy.Direction]bool {
		out := map[policy.Direction]bool{}
		for e := range f.enforcement.All(f.db.ReadTxn()) {
			out[e.Direction] = e.Enforced
		}
		return out
	}
	f.upsertPolicies(t, cidrPolicy("web", policy.Ingress, nil, "10.0.0.0/8"))
	f.round(t)
	require.Empty(t, enforced(), "the datapath keeps its enforcement until the tables are initialized")
	f.deletePolicy(t, cidrPolicy("web", policy.Ingress, nil, "10.0.0.0/8"))
	f.policiesRead()
	f.ipcacheResolved()
	f.round(t)
	require.Equal(t, map[policy.Direction]bool{policy.Ingress: false, policy.Egress: false}, enforced(), "both rows exist from initialization on")

	deny := &policy.Policy{Name: "deny-egress", Egress: []policy.Rule{{}}}
	f.upsertPolicies(t, deny)
	f.round(t)
	require.Equal(t, map[policy.Direction]bool{policy.Ingress: false, policy.Egress: true}, enforced(), "an empty rule enforces its direction")
	require.Empty(t, f.table(), "and allows nothing")

	f.deletePolicy(t, deny)
	f.round(t)
	require.Equal(t, map[policy.Direction]bool{policy.Ingress: false, policy.Egress: false}, enforced())
}

// TestSelectorMatchesBruteForce changes policies and identities at random
// and checks after every round that the table is what a computation from
// scratch gives, and that entries that did not change kept their
// reconciliation status.
func TestSelectorMatchesBruteForce(t *testing.T) {
	f := newEngineFixture(t)
	f.policiesRead()
	f.ipcacheResolved()
	rng := rand.New(rand.NewPCG(7, 11))

	var universe []netip.Prefix
	for _, s := range []string{"0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.1.0/24", "10.1.1.1/32",
		"10.2.0.0/16", "10.2.0.0/24", "192.0.2.0/24", "192.0.2.128/25", "::/0", "2001:db8::/32",
		"2001:db8:1::/48", "2001:db8:1::1/128"} {
		universe = append(universe, netip.MustParsePrefix(s))
	}
	randomPrefix := func() netip.Prefix { return universe[rng.IntN(len(universe))] }
	randomRule := func() policy.Rule {
		var rule policy.Rule
		for range rng.IntN(3) {
			peer := policy.CIDRSelector{CIDR: randomPrefix()}
			for _, e := range universe {
				if e != peer.CIDR && prefixkey.Inside(peer.CIDR, e) && rng.IntN(4) == 0 {
					peer.Except = append(peer.Except, e)
				}
			}
			rule.Peers = append(rule.Peers, peer)
		}
		rule.Deny = rng.IntN(4) == 0
		rule.AnyPeer = rng.IntN(6) == 0
		rule.NoDefaultDeny = rng.IntN(4) == 0
		switch rng.IntN(6) {
		case 0:
			rule.Ports = []policy.PortRange{{Port: uint16(53 + rng.IntN(2)), Protocol: policy.ProtocolUDP}, {Port: 443, Protocol: policy.ProtocolTCP}}
		case 1:
			rule.Ports = []policy.PortRange{{Port: uint16(440 + rng.IntN(4)), EndPort: uint16(444 + rng.IntN(8)), Protocol: policy.ProtocolTCP}}
		case 2:
			rule.Ports = []policy.PortRange{{Protocol: policy.ProtocolTCP}, {Port: 8, Protocol: policy.ProtocolICMP}}
		}
		return rule
	}
	policies := map[string]*policy.Policy{}
	identities := map[identity.Number]*identitycell.Identity{}

	var previous map[policy.Key]string
	for step := range 300 {
		for range 1 + rng.IntN(4) {
			switch op := rng.IntN(4); {
			case op == 0 && len(policies) > 0:
				name := slices.Sorted(maps.Keys(policies))[rng.IntN(len(policies))]
				f.deletePolicy(t, policies[name])
				delete(policies, name)
			case op == 1:
				p := &policy.Policy{Name: fmt.Sprintf("p%d", rng.IntN(8))}
				for range rng.IntN(3) {
					p.Ingress = append(p.Ingress, randomRule())
				}
				for range rng.IntN(3) {
					p.Egress = append(p.Egress, randomRule())
				}
				f.upsertPolicies(t, p)
				policies[p.Name] = p
			case op == 2 && len(identities) > 0:
				ids := slices.Sorted(maps.Keys(identities))
				id := ids[rng.IntN(len(ids))]
				f.deleteIdentity(t, identities[id])
				delete(identities, id)
			default:
				id := identity.MinLocal + identity.Number(rng.IntN(12))
				lbls := []string{labels.CIDRLabel(randomPrefix())}
				if rng.IntN(4) == 0 {
					lbls = append(lbls, labels.CIDRLabel(randomPrefix()))
				}
				if rng.IntN(4) == 0 {
					lbls = []string{"app:no-cidr"}
				}
				i := identityRow(id, lbls...)
				if slices.ContainsFunc(slices.Collect(maps.Values(identities)), func(other *identitycell.Identity) bool {
					return other.ID != id && other.Labels == i.Labels
				}) {
					continue // a label set has one identity (the allocator's rule, and the table's)
				}
				f.upsertIdentities(t, i)
				identities[id] = i
			}
		}
		f.round(t)

		want := bruteForce(slices.Collect(maps.Values(policies)), slices.Collect(maps.Values(identities)))
		require.Equal(t, want, f.table(), "step %d", step)
		wantEnforced, wantDeny := map[policy.Direction]bool{}, map[policy.Direction]bool{}
		for _, p := range policies {
			for _, dir := range policy.Directions() {
				for _, rule := range p.Rules(dir) {
					wantEnforced[dir] = wantEnforced[dir] || !rule.NoDefaultDeny
					wantDeny[dir] = wantDeny[dir] || rule.Deny
				}
			}
		}
		for e := range f.enforcement.All(f.db.ReadTxn()) {
			require.Equal(t, wantEnforced[e.Direction], e.Enforced, "step %d: %s", step, e.Direction)
			require.Equal(t, wantDeny[e.Direction], e.HasDeny, "step %d: %s", step, e.Direction)
		}
		require.Equal(t, 2, f.enforcement.NumObjects(f.db.ReadTxn()))
		for e := range f.entries.All(f.db.ReadTxn()) {
			if previous != nil && previous[e.Key] == strings.Join(e.Policies, ",") {
				require.Equal(t, reconciler.StatusKindDone, e.Status.Kind, "step %d: unchanged entry %s rewritten", step, e.Key)
			}
		}
		previous = want
		markAllDone(t, f)
	}
}

// markAllDone does what the datapath reconciler does.
func markAllDone(t *testing.T, f *engineFixture) {
	txn := f.db.WriteTxn(f.entries)
	for e := range f.entries.All(txn) {
		if e.Status.Kind != reconciler.StatusKindDone {
			_, _, err := f.entries.Insert(txn, e.Clone().SetStatus(reconciler.StatusDone()))
			require.NoError(t, err)
		}
	}
	txn.Commit()
}

// TestIdentityCostIndependentOfOtherPolicies: an identity appearing makes
// the engine examine the selectors that contain its prefix and nothing
// else, however many other policies exist.
func TestIdentityCostIndependentOfOtherPolicies(t *testing.T) {
	visitedFor := func(otherPolicies int) int {
		f := newEngineFixture(t)
		var batch []*policy.Policy
		for i := range otherPolicies {
			batch = append(batch, cidrPolicy(fmt.Sprintf("other-%d", i), policy.Egress, nil,
				fmt.Sprintf("11.%d.%d.0/24", i/256, i%256)))
		}
		batch = append(batch, cidrPolicy("selects", policy.Egress, nil, "10.0.0.0/8"))
		f.upsertPolicies(t, batch...)
		f.round(t)
		before := f.engine.visited
		f.upsertIdentities(t, identityRow(16777217, "cidr:10.1.2.0/24"))
		f.round(t)
		require.Equal(t, map[policy.Key]string{{Identity: 16777217, Direction: policy.Egress, Protocol: 0, Port: 0}: "selects"}, f.table())
		return f.engine.visited - before
	}
	small, large := visitedFor(1_000), visitedFor(10_000)
	require.Equal(t, 1, small, "one selector contains the prefix")
	require.Equal(t, small, large)
}

// TestSelectorIdleWithoutRules: with no rule in force, identities that
// come and go mark nothing dirty and write nothing (a restart's million
// identities cost no recomputation); a rule added afterwards selects the
// identities that exist then, and once its entries are gone again the
// engine is idle again.
func TestSelectorIdleWithoutRules(t *testing.T) {
	f := newEngineFixture(t)
	f.policiesRead()
	f.ipcacheResolved()
	f.upsertIdentities(t,
		identityRow(16777217, "cidr:10.1.0.0/16"),
		identityRow(16777218, "cidr:192.0.2.0/24"),
	)
	f.round(t)
	require.True(t, f.initialized())
	require.Empty(t, f.table())
	require.Zero(t, f.engine.recomputed, "no identity is recomputed while no rule is in force")
	entriesRev := f.entries.Revision(f.db.ReadTxn())

	f.deleteIdentity(t, identityRow(16777218, "cidr:192.0.2.0/24"))
	f.upsertIdentities(t, identityRow(16777219, "cidr:10.2.0.0/16"))
	f.round(t)
	require.Zero(t, f.engine.recomputed)
	require.Equal(t, entriesRev, f.entries.Revision(f.db.ReadTxn()), "nothing written")

	web := cidrPolicy("web", policy.Egress, nil, "10.0.0.0/8")
	f.upsertPolicies(t, web)
	f.round(t)
	require.Equal(t, map[policy.Key]string{
		{Identity: 16777217, Direction: policy.Egress}: "web",
		{Identity: 16777219, Direction: policy.Egress}: "web",
	}, f.table(), "a rule added later selects the identities that exist")

	// The rule goes and an identity it selected goes in the same round:
	// its entry goes too, though no rule is in force any more.
	f.deletePolicy(t, web)
	f.deleteIdentity(t, identityRow(16777219, "cidr:10.2.0.0/16"))
	f.round(t)
	require.Empty(t, f.table())
	recomputed := f.engine.recomputed
	f.upsertIdentities(t, identityRow(16777220, "cidr:10.3.0.0/16"))
	f.round(t)
	require.Equal(t, recomputed, f.engine.recomputed, "idle again once the entries are gone")
	require.Empty(t, f.table())
}

// TestSelectorTableBounded: policies that select more than the table may
// hold (entryBound times the policy map) leave the entries beyond it
// uncomputed, denies first in, and nothing beyond the bound is held; once
// room appears, they are computed.
func TestSelectorTableBounded(t *testing.T) {
	f := newEngineFixture(t)
	f.policiesRead()
	f.ipcacheResolved()
	f.engine.maxEntries = 4
	var ids []*identitycell.Identity
	for i := range 6 {
		ids = append(ids, identityRow(identity.MinLocal+identity.Number(i),
			labels.CIDRLabel(netip.MustParsePrefix(fmt.Sprintf("10.0.%d.0/24", i)))))
	}
	f.upsertIdentities(t, ids...)
	wide := &policy.Policy{Name: "wide", Egress: []policy.Rule{{Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/16")}},
		Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 443}}}}}
	deny := &policy.Policy{Name: "deny", Egress: []policy.Rule{{Deny: true, Peers: []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.3.0/24")}},
		Ports: []policy.PortRange{{Protocol: policy.ProtocolTCP, Port: 22}}}}}
	f.upsertPolicies(t, wide, deny)
	f.round(t)
	table := f.table()
	require.Len(t, table, 4, "the table holds no more than its bound")
	// The fourth identity had room for one of its two entries.
	require.Equal(t, "deny:deny", table[policy.Key{Identity: ids[3].ID, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 22}],
		"an identity's deny goes in before its allows")
	missing := 0
	for _, n := range f.engine.notComputed {
		missing += n
	}
	require.Equal(t, 3, missing, "7 entries, 4 computed")

	health := &recordingHealth{}
	f.engine.reportHealth(health)
	require.ErrorIs(t, health.err, ErrPolicyTableFull)
	require.Contains(t, health.err.Error(), "3 policy entries of")

	// Room appears: the deny goes, and what did not fit is computed.
	f.deletePolicy(t, deny)
	f.round(t)
	f.round(t) // the round that tries again what did not fit
	require.Len(t, f.table(), 4)
	f.deleteIdentity(t, ids[0])
	f.deleteIdentity(t, ids[1])
	f.round(t)
	f.round(t)
	require.Len(t, f.table(), 4)
	require.Empty(t, f.engine.notComputed)
	f.engine.reportHealth(health)
	require.NoError(t, health.err)
}

// recordingHealth keeps the last health error reported.
type recordingHealth struct {
	cell.Health
	err error
}

func (h *recordingHealth) OK(string)                  { h.err = nil }
func (h *recordingHealth) Degraded(_ string, e error) { h.err = e }

// host is the i-th /32 of 10.0.0.0/16.
func host(i int) string { return fmt.Sprintf("10.0.%d.%d/32", i>>8, i&0xff) }

// hostIdentities returns the identities of the first n hosts (host), and
// four more: a /24, a /32 with another label, an IPv6 /128 and one
// without a cidr label.
func hostIdentities(n int) []*identitycell.Identity {
	var identities []*identitycell.Identity
	for i := range n {
		identities = append(identities, identityRow(identity.Number(16777217+i), "cidr:"+host(i)))
	}
	return append(identities,
		identityRow(16800000, "cidr:10.9.1.0/24"),
		identityRow(16800001, "cidr:10.9.2.2/32", "app:x"),
		identityRow(16800002, "cidr:2001:db8::1/128"),
		identityRow(16800003, "app:no-cidr"))
}

// TestSelectorLargePolicy: a policy with about as many CIDRs as there are
// identities marks its identities by one pass over them
// (markIndexedWithin, not markWithin per CIDR); added, replaced and
// deleted after its identities were processed, it gives the entries the
// brute force gives, another policy's entries on the same identities
// included, of identities with a narrower prefix or other labels too.
func TestSelectorLargePolicy(t *testing.T) {
	f := newEngineFixture(t)
	f.policiesRead()
	f.ipcacheResolved()
	identities := hostIdentities(1500)
	f.upsertIdentities(t, identities...)
	small := cidrPolicy("small", policy.Ingress, nil, host(3), "10.9.0.0/16")
	f.upsertPolicies(t, small)
	f.round(t)

	var cidrs []string
	for i := range 1200 {
		cidrs = append(cidrs, host(i))
	}
	large := cidrPolicy("large", policy.Egress, []policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}},
		append(cidrs, "10.9.0.0/16", "2001:db8::/32")...)
	require.True(t, cidrPeers(large) >= scanMinCIDRs && cidrPeers(large)*scanRatio >= len(identities),
		"the policy is large enough to be marked by a pass over the identities")
	f.upsertPolicies(t, large)
	f.round(t)
	require.Equal(t, bruteForce([]*policy.Policy{small, large}, identities), f.table())
	require.Equal(t, 3+1200+3, len(f.table()), "small's three identities, large's")

	// Replaced: the first 200 CIDRs go, 300 come, and 10.9.0.0/16 goes.
	cidrs = nil
	for i := 200; i < 1500; i++ {
		cidrs = append(cidrs, host(i))
	}
	replaced := cidrPolicy("large", policy.Egress, []policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}},
		append(cidrs, "2001:db8::/32")...)
	f.upsertPolicies(t, replaced)
	f.round(t)
	require.Equal(t, bruteForce([]*policy.Policy{small, replaced}, identities), f.table())

	f.deletePolicy(t, replaced)
	f.round(t)
	require.Equal(t, bruteForce([]*policy.Policy{small}, identities), f.table())
	require.Equal(t, 3, len(f.table()))
}

// TestSelectorPoliciesScannedTogether: policies that a round adds, none
// large enough on its own to be marked by a pass over the identities but
// together as many CIDRs as there are identities (a directory's first
// read), are marked by one pass for all of them, and give the entries the
// brute force gives; added one round each, they are marked CIDR by CIDR.
func TestSelectorPoliciesScannedTogether(t *testing.T) {
	identities := hostIdentities(2400)
	var policies []*policy.Policy
	for p := range 4 {
		var cidrs []string
		for i := p * 600; i < (p+1)*600; i++ {
			cidrs = append(cidrs, host(i))
		}
		if p == 1 {
			cidrs = append(cidrs, "10.9.0.0/16", "2001:db8::/32")
		}
		if p == 2 {
			cidrs = append(cidrs, "0.0.0.0/0")
		}
		pol := cidrPolicy(fmt.Sprintf("p%d", p), policy.Egress, []policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}}, cidrs...)
		require.Less(t, cidrPeers(pol), scanMinCIDRs, "each policy too small for a pass of its own")
		policies = append(policies, pol)
	}

	// withIdentities is an engine whose identities are processed, before
	// any policy.
	withIdentities := func(t *testing.T) *engineFixture {
		f := newEngineFixture(t)
		f.policiesRead()
		f.ipcacheResolved()
		f.upsertIdentities(t, identities...)
		f.round(t)
		return f
	}

	t.Run("one round", func(t *testing.T) {
		f := withIdentities(t)
		passes := f.engine.passes
		f.upsertPolicies(t, policies...)
		f.round(t)
		require.Equal(t, passes+1, f.engine.passes, "one pass for the four")
		require.Equal(t, bruteForce(policies, identities), f.table())

		// A policy replaced, one deleted and one added in one round, too
		// few CIDRs for a pass: the entries are still the brute force's.
		replaced := cidrPolicy("p0", policy.Egress, nil, host(5), host(2399), "10.9.1.0/24")
		f.deletePolicy(t, policies[3])
		f.upsertPolicies(t, replaced, cidrPolicy("p4", policy.Ingress, nil, "10.0.0.0/8"))
		f.round(t)
		require.Equal(t, bruteForce([]*policy.Policy{replaced, policies[1], policies[2], cidrPolicy("p4", policy.Ingress, nil, "10.0.0.0/8")}, identities), f.table())
	})

	t.Run("a round each", func(t *testing.T) {
		f := withIdentities(t)
		passes := f.engine.passes
		for _, p := range policies {
			f.upsertPolicies(t, p)
			f.round(t)
		}
		require.Equal(t, passes, f.engine.passes, "no pass")
		require.Equal(t, bruteForce(policies, identities), f.table())
	})
}
