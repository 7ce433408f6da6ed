// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// withEndpoints gives the fixture's engine and progress the `endpoints`
// table, as a hive with an endpoint cell does. Before the first round.
func (f *engineFixture) withEndpoints() *engineFixture {
	f.engine.endpoints = f.endpoints
	f.engine.progress.endpoints = f.endpoints
	return f
}

// withDNSRules makes the engine write the `dns-rules` table.
func (f *engineFixture) withDNSRules() *engineFixture {
	f.engine.writeDNSRulesTo(f.dnsRules)
	return f
}

// dnsTable returns the `dns-rules` table as subject -> "names policies".
func (f *engineFixture) dnsTable() map[identity.Number]string {
	out := map[identity.Number]string{}
	for r := range f.dnsRules.All(f.db.ReadTxn()) {
		row := r.TableRow()
		out[r.Subject] = row[1] + " " + row[2]
	}
	return out
}

func (f *engineFixture) upsertEndpoints(tb testing.TB, endpoints ...*endpoint.State) {
	tb.Helper()
	txn := f.db.WriteTxn(f.endpoints)
	for _, ep := range endpoints {
		_, _, err := f.endpoints.Insert(txn, ep)
		require.NoError(tb, err)
	}
	txn.Commit()
}

func (f *engineFixture) deleteEndpoints(tb testing.TB, endpoints ...*endpoint.State) {
	tb.Helper()
	txn := f.db.WriteTxn(f.endpoints)
	for _, ep := range endpoints {
		_, _, err := f.endpoints.Delete(txn, ep)
		require.NoError(tb, err)
	}
	txn.Commit()
}

// localEndpoint returns the row of a local endpoint of namespace shop
// with the labels (key, value, ...) and identity id.
func localEndpoint(tb testing.TB, name string, id identity.Number, addr netip.Addr, kv ...string) *endpoint.State {
	tb.Helper()
	ep := endpoint.Endpoint{Namespace: "shop", Name: name, Labels: map[string]string{}, Addresses: []netip.Addr{addr}}
	for i := 0; i+1 < len(kv); i += 2 {
		ep.Labels[kv[i]] = kv[i+1]
	}
	lbls, err := ep.IdentityLabels(nil)
	require.NoError(tb, err)
	return &endpoint.State{Endpoint: ep, Identity: id, IdentityLabels: lbls, Local: true}
}

// selectingPolicy is cidrPolicy applied to the endpoints labelled
// app=app.
func selectingPolicy(name, app string, cidrs ...string) *policy.Policy {
	p := cidrPolicy(name, policy.Egress, []policy.PortRange{{Port: 443, Protocol: policy.ProtocolTCP}}, cidrs...)
	p.Selector = policy.EndpointSelector{MatchLabels: map[string]string{"app": app}}
	return p
}

// TestWaitComputedEndpoints: the datapath waits until the selectors have
// seen the endpoints of its snapshot, with or without CIDR selectors (a
// new endpoint's enforcement rows follow from any policy).
func TestWaitComputedEndpoints(t *testing.T) {
	f := newEngineFixture(t).withEndpoints()
	wait := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := f.engine.progress.WaitComputed(ctx, f.db.ReadTxn())
		return err
	}
	f.round(t)
	require.NoError(t, wait())
	f.upsertEndpoints(t, localEndpoint(t, "web-1", 300, netip.MustParseAddr("10.9.0.1"), "app", "web"))
	require.ErrorIs(t, wait(), context.DeadlineExceeded, "the endpoint is not computed yet")
	f.round(t)
	require.NoError(t, wait())
}

// TestEndpointCost: an endpoint costs what its identity's policies
// select. A second endpoint of an identity recomputes nothing; the first
// of an identity recomputes the identities its policies select, not those
// of the other policies; the last one going does the same.
func TestEndpointCost(t *testing.T) {
	f := newEngineFixture(t).withEndpoints()
	var policies []*policy.Policy
	for i := range 20 {
		cidr := fmt.Sprintf("10.%d.0.0/16", i)
		policies = append(policies, selectingPolicy(fmt.Sprintf("p-%d", i), fmt.Sprintf("app-%d", i), cidr))
		f.upsertIdentities(t, identityRow(identity.MinLocal+identity.Number(i), "cidr:"+cidr))
	}
	f.upsertPolicies(t, policies...)
	f.policiesRead()
	f.ipcacheResolved()
	f.round(t)
	require.Zero(t, f.entries.NumObjects(f.db.ReadTxn()), "no endpoint: no subject of any policy")

	first := localEndpoint(t, "a-1", 300, netip.MustParseAddr("10.9.0.1"), "app", "app-3")
	before := f.engine.recomputed
	f.upsertEndpoints(t, first)
	f.round(t)
	require.Equal(t, 1, f.engine.recomputed-before, "the first endpoint of an identity: its one policy's identity")
	require.Equal(t, map[policy.Key]string{
		{Subject: 300, Identity: identity.MinLocal + 3, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443}: "p-3",
	}, f.table())

	second := localEndpoint(t, "a-2", 300, netip.MustParseAddr("10.9.0.2"), "app", "app-3")
	before = f.engine.recomputed
	f.upsertEndpoints(t, second)
	f.round(t)
	require.Zero(t, f.engine.recomputed-before, "a second endpoint of the identity shares its entries")

	before = f.engine.recomputed
	f.deleteEndpoints(t, first)
	f.round(t)
	require.Zero(t, f.engine.recomputed-before, "the identity keeps an endpoint")
	require.Len(t, f.table(), 1)

	f.deleteEndpoints(t, second)
	f.round(t)
	require.Equal(t, 1, f.engine.recomputed-before, "the last endpoint of the identity goes")
	require.Empty(t, f.table())
	for row := range f.enforcement.All(f.db.ReadTxn()) {
		require.Equal(t, identity.Unknown, row.Subject, "only the default's enforcement rows are left")
	}
}

// TestSubjectsMatchBruteForce: after each of 300 rounds of random changes
// to policies (rules and selectors) and endpoints (appearing, changing
// identity, going), the `policy` table is, subject by subject, what the
// brute-force computation gives for the policies that select the subject,
// and each subject's enforcement rows are those of its policies.
func TestSubjectsMatchBruteForce(t *testing.T) {
	f := newEngineFixture(t).withEndpoints()
	f.policiesRead()
	f.ipcacheResolved()
	rng := rand.New(rand.NewPCG(3, 5))

	var identities []*identitycell.Identity
	cidrs := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.1.0/24", "192.0.2.0/24"}
	for i, c := range cidrs {
		identities = append(identities, identityRow(identity.MinLocal+identity.Number(i), "cidr:"+c))
	}
	f.upsertIdentities(t, identities...)
	// The label sets of the endpoint identities.
	labelSets := map[identity.Number][]string{
		300: {"app", "a"}, 301: {"app", "b", "tier", "x"}, 302: {"app", "a", "tier", "y"}, 303: {"app", "c"},
	}
	selectors := []policy.EndpointSelector{
		{},
		{MatchLabels: map[string]string{"app": "a"}},
		{MatchExpressions: []policy.Requirement{{Key: "app", Operator: policy.OpIn, Values: []string{"a", "b"}}}},
		{MatchExpressions: []policy.Requirement{{Key: "app", Operator: policy.OpNotIn, Values: []string{"a"}}}},
		{MatchExpressions: []policy.Requirement{{Key: "tier", Operator: policy.OpExists}}},
		{MatchExpressions: []policy.Requirement{{Key: "tier", Operator: policy.OpDoesNotExist}}},
		{MatchLabels: map[string]string{"app": "c"}, Namespace: "other"},
	}
	randomRule := func() policy.Rule {
		rule := policy.Rule{Deny: rng.IntN(4) == 0, AnyPeer: rng.IntN(5) == 0, NoDefaultDeny: rng.IntN(4) == 0}
		for range rng.IntN(3) {
			rule.Peers = append(rule.Peers, policy.CIDRSelector{CIDR: netip.MustParsePrefix(cidrs[rng.IntN(len(cidrs))])})
		}
		if rng.IntN(2) == 0 {
			rule.Ports = []policy.PortRange{{Port: uint16(440 + rng.IntN(4)), Protocol: policy.ProtocolTCP}}
		}
		return rule
	}
	policies := map[string]*policy.Policy{}
	endpoints := map[string]*endpoint.State{}

	for step := range 300 {
		for range 1 + rng.IntN(4) {
			switch op := rng.IntN(4); {
			case op == 0 && len(policies) > 0:
				name := slices.Sorted(maps.Keys(policies))[rng.IntN(len(policies))]
				f.deletePolicy(t, policies[name])
				delete(policies, name)
			case op == 1:
				p := &policy.Policy{Name: fmt.Sprintf("p%d", rng.IntN(6)), Selector: selectors[rng.IntN(len(selectors))]}
				for range rng.IntN(3) {
					p.Ingress = append(p.Ingress, randomRule())
				}
				for range rng.IntN(3) {
					p.Egress = append(p.Egress, randomRule())
				}
				f.upsertPolicies(t, p)
				policies[p.Name] = p
			case op == 2 && len(endpoints) > 0:
				name := slices.Sorted(maps.Keys(endpoints))[rng.IntN(len(endpoints))]
				f.deleteEndpoints(t, endpoints[name])
				delete(endpoints, name)
			default:
				k := rng.IntN(6)
				id := identity.Number(300 + rng.IntN(len(labelSets)))
				ep := localEndpoint(t, fmt.Sprintf("e%d", k), id, netip.AddrFrom4([4]byte{172, 16, 0, byte(k)}), labelSets[id]...)
				ep.Local = rng.IntN(8) != 0
				f.upsertEndpoints(t, ep)
				endpoints[ep.Name] = ep
			}
		}
		f.round(t)

		subjects := map[identity.Number]map[string]string{0: nil}
		for _, ep := range endpoints {
			if ep.Local {
				subjects[ep.Identity] = endpoint.KeyValues(ep.IdentityLabels)
			}
		}
		want := map[policy.Key]string{}
		wantEnforcement := map[policy.EnforcementKey][2]bool{}
		for subject, kv := range subjects {
			var selected []*policy.Policy
			for _, p := range policies {
				if subject == 0 && p.Selector.Empty() || subject != 0 && p.Selector.Matches(kv) {
					selected = append(selected, p)
				}
			}
			for k, v := range bruteForce(selected, identities) {
				k.Subject = subject
				want[k] = v
			}
			for _, dir := range policy.Directions() {
				var enforced, deny bool
				for _, p := range selected {
					for _, rule := range p.Rules(dir) {
						enforced = enforced || !rule.NoDefaultDeny
						deny = deny || rule.Deny
					}
				}
				wantEnforcement[policy.EnforcementKey{Subject: subject, Direction: dir}] = [2]bool{enforced, deny}
			}
		}
		require.Equal(t, want, f.table(), "step %d", step)
		got := map[policy.EnforcementKey][2]bool{}
		for row := range f.enforcement.All(f.db.ReadTxn()) {
			got[row.Key()] = [2]bool{row.Enforced, row.HasDeny}
		}
		require.Equal(t, wantEnforcement, got, "step %d", step)
	}
}
