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

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestPeersMatchBruteForce: with peers by label, by entity and by DNS
// name (toFQDNs), DNS rules, policies, peer identities (endpoint
// identities, node addresses with a reserved label, CIDR identities,
// addresses the DNS proxy learned with fqdn labels) and local endpoints
// changing at random, the engine's tables equal a computation from
// scratch after every round.
func TestPeersMatchBruteForce(t *testing.T) {
	f := newEngineFixture(t).withEndpoints().withDNSRules()
	f.policiesRead()
	f.ipcacheResolved()
	rng := rand.New(rand.NewPCG(7, 11))

	// The identities that may exist, by number; each step adds or removes
	// some (a relabelled endpoint is one number going, another coming).
	pool := map[identity.Number][]string{
		identity.MinLocal:     {"cidr:10.0.0.0/8"},
		identity.MinLocal + 1: {"cidr:10.0.0.5/32", "reserved:host"},
		identity.MinLocal + 2: {"cidr:192.0.2.7/32", "reserved:remote-node"},
		identity.MinLocal + 3: {"cidr:192.0.2.8/32", "reserved:remote-node", "reserved:kube-apiserver"},
		300:                   {"k8s:app=a", "k8s:io.kubernetes.pod.namespace=shop"},
		301:                   {"k8s:app=b", "k8s:tier=x", "k8s:io.kubernetes.pod.namespace=shop"},
		302:                   {"k8s:app=a", "k8s:io.kubernetes.pod.namespace=other", "k8s:io.cilium.k8s.namespace.labels.team=blue"},
		303:                   {"k8s:app=c", "k8s:io.kubernetes.pod.namespace=other"},
		304:                   {"k8s:app=a"}, // labels of an embedder's identity without a namespace: no peer by label
		identity.MinLocal + 4: {"cidr:0.0.0.0/0", "cidr:198.51.100.7/32", "fqdn:api.example.com"},
		identity.MinLocal + 5: {"cidr:0.0.0.0/0", "cidr:198.51.100.8/32", "fqdn:*.example.com", "fqdn:api.example.com"},
		identity.MinLocal + 6: {"cidr:0.0.0.0/0", "cidr:198.51.100.9/32", "fqdn:other.example.org"},
	}
	fqdnSelectors := []fqdn.Selector{{MatchName: "API.example.com."}, {MatchPattern: "*.example.com"}, {MatchName: "nowhere.example.net"}}
	dns53 := policy.PortRange{Protocol: policy.ProtocolUDP, Port: 53}
	// withFQDN gives an egress allow rule toFQDNs (its only peers) or DNS
	// rules on UDP/53, at random.
	withFQDN := func(rule policy.Rule) policy.Rule {
		if rule.Deny {
			return rule
		}
		switch rng.IntN(3) {
		case 0:
			rule.Endpoints, rule.Entities, rule.Peers = nil, nil, nil
			rule.FQDN = &policy.FQDNRule{Selectors: []fqdn.Selector{fqdnSelectors[rng.IntN(len(fqdnSelectors))]}}
		case 1:
			rule.FQDN = &policy.FQDNRule{DNS: []policy.DNSRule{{Ports: []policy.PortRange{dns53}, Names: fqdnSelectors[rng.IntN(len(fqdnSelectors)):]}}}
			rule.Ports = append(rule.Ports, dns53)
		}
		return rule
	}
	poolIDs := slices.Sorted(maps.Keys(pool))
	peerSelectors := []policy.EndpointSelector{
		{},
		{Namespace: "shop"},
		{MatchLabels: map[string]string{"app": "a"}},
		{MatchLabels: map[string]string{"app": "a"}, Namespace: "shop"},
		{MatchExpressions: []policy.Requirement{{Key: "tier", Operator: policy.OpExists}}},
		{MatchExpressions: []policy.Requirement{{Key: "app", Operator: policy.OpNotIn, Values: []string{"a"}}}},
		{MatchLabels: map[string]string{"io.cilium.k8s.namespace.labels.team": "blue"}},
		{MatchLabels: map[string]string{"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "other"}},
	}
	entities := []identity.Entity{"host", "remote-node", "kube-apiserver", "cluster", "health", "init", "ingress", "unmanaged"}
	subjectSelectors := []policy.EndpointSelector{{}, {MatchLabels: map[string]string{"app": "a"}}, {Namespace: "other"}}
	randomRule := func() policy.Rule {
		rule := policy.Rule{Deny: rng.IntN(4) == 0}
		switch rng.IntN(3) {
		case 0:
			for range 1 + rng.IntN(2) {
				rule.Endpoints = append(rule.Endpoints, peerSelectors[rng.IntN(len(peerSelectors))])
			}
		case 1:
			for range 1 + rng.IntN(2) {
				if e := entities[rng.IntN(len(entities))]; !slices.Contains(rule.Entities, e) {
					rule.Entities = append(rule.Entities, e)
				}
			}
		default:
			rule.Peers = []policy.CIDRSelector{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}
		}
		if rng.IntN(2) == 0 {
			rule.Ports = []policy.PortRange{{Port: uint16(80 + rng.IntN(3)), Protocol: policy.ProtocolTCP}}
		}
		return rule
	}
	policies := map[string]*policy.Policy{}
	present := map[identity.Number]*identitycell.Identity{}
	endpoints := map[string]*endpoint.State{}

	for step := range 400 {
		for range 1 + rng.IntN(4) {
			switch op := rng.IntN(6); {
			case op == 0 && len(policies) > 0:
				name := slices.Sorted(maps.Keys(policies))[rng.IntN(len(policies))]
				f.deletePolicy(t, policies[name])
				delete(policies, name)
			case op <= 2:
				p := &policy.Policy{Name: fmt.Sprintf("p%d", rng.IntN(6)), Selector: subjectSelectors[rng.IntN(len(subjectSelectors))]}
				for range 1 + rng.IntN(2) {
					p.Ingress = append(p.Ingress, randomRule())
				}
				for range rng.IntN(2) {
					p.Egress = append(p.Egress, withFQDN(randomRule()))
				}
				f.upsertPolicies(t, p)
				policies[p.Name] = p
			case op == 3:
				id := poolIDs[rng.IntN(len(poolIDs))]
				if row, ok := present[id]; ok {
					f.deleteIdentity(t, row)
					delete(present, id)
				} else {
					row := identityRow(id, pool[id]...)
					f.upsertIdentities(t, row)
					present[id] = row
				}
			case op == 4 && len(endpoints) > 0:
				name := slices.Sorted(maps.Keys(endpoints))[rng.IntN(len(endpoints))]
				f.deleteEndpoints(t, endpoints[name])
				delete(endpoints, name)
			default:
				// A local endpoint of one of the shop identities.
				id := identity.Number(300 + rng.IntN(2))
				k := rng.IntN(3)
				kv := map[int][]string{300: {"app", "a"}, 301: {"app", "b", "tier", "x"}}[int(id)]
				ep := localEndpoint(t, fmt.Sprintf("e%d", k), id, netip.AddrFrom4([4]byte{172, 16, 0, byte(k)}), kv...)
				f.upsertEndpoints(t, ep)
				endpoints[ep.Name] = ep
			}
		}
		f.round(t)

		subjects := map[identity.Number]map[string]string{0: nil}
		for _, ep := range endpoints {
			subjects[ep.Identity] = endpoint.KeyValues(ep.IdentityLabels)
		}
		identities := slices.Collect(maps.Values(present))
		want := map[policy.Key]string{}
		wantDNS := map[identity.Number]string{}
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
			if names, pols := bruteDNSRules(selected); len(pols) > 0 {
				wantDNS[subject] = names + " " + pols
			}
		}
		require.Equal(t, want, f.table(), "step %d", step)
		require.Equal(t, wantDNS, f.dnsTable(), "step %d", step)
	}
}

// TestPeerChangeCost: an endpoint identity appearing is matched against
// each distinct peer selector once, however many rules share it, and a
// new peer selector visits only the identities with peer labels, not the
// CIDR identities.
func TestPeerChangeCost(t *testing.T) {
	f := newEngineFixture(t)
	f.policiesRead()
	f.ipcacheResolved()
	var cidrs []*identitycell.Identity
	for i := range 2000 {
		cidrs = append(cidrs, identityRow(identity.MinLocal+identity.Number(i),
			"cidr:"+netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24).String()))
	}
	f.upsertIdentities(t, cidrs...)
	peer := policy.EndpointSelector{MatchLabels: map[string]string{"app": "db"}}
	for i := range 50 {
		f.upsertPolicies(t, &policy.Policy{Name: fmt.Sprintf("p%d", i),
			Ingress: []policy.Rule{{Endpoints: []policy.EndpointSelector{peer}}}})
	}
	f.round(t)
	require.Len(t, f.engine.peerIndex.groups, 1, "50 rules, one distinct selector")

	f.engine.visited, f.engine.recomputed = 0, 0
	f.upsertIdentities(t, identityRow(400, "k8s:app=db", "k8s:io.kubernetes.pod.namespace=shop"))
	f.round(t)
	require.Equal(t, 1, f.engine.recomputed, "only the new identity")
	require.Equal(t, 1, f.engine.visited, "one distinct selector matched once")
	require.Len(t, f.table(), 1, "identity 400 allowed by the default's policies (one key, 50 policies)")

	// A new selector marks only the identities with peer labels.
	f.engine.recomputed = 0
	f.upsertPolicies(t, &policy.Policy{Name: "other",
		Ingress: []policy.Rule{{Endpoints: []policy.EndpointSelector{{MatchLabels: map[string]string{"app": "web"}}}}}})
	f.round(t)
	require.Zero(t, f.engine.recomputed, "app=web selects no identity: nothing to recompute")
}

// bruteDNSRules is a subject's `dns-rules` row from the policies that
// apply to it: the canonical names of their egress DNS rules, distinct and
// sorted by text, and the policies that have any ("" when none has).
func bruteDNSRules(policies []*policy.Policy) (names, pols string) {
	seen := map[string]struct{}{}
	var withDNS []string
	for _, p := range policies {
		has := false
		for _, rule := range p.Egress {
			if rule.FQDN == nil || rule.Deny {
				continue
			}
			for _, dns := range rule.FQDN.DNS {
				has = true
				for _, n := range dns.Names {
					seen[n.String()] = struct{}{}
				}
			}
		}
		if has {
			withDNS = append(withDNS, p.Name)
		}
	}
	slices.Sort(withDNS)
	return strings.Join(slices.Sorted(maps.Keys(seen)), ","), strings.Join(withDNS, ",")
}
