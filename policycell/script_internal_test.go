// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestNotWrittenByFile: a file counts the rows of its policies whose
// status is Error, once per row even if several of its policies share it,
// with each distinct error once; rows Done or Pending do not count.
func TestNotWrittenByFile(t *testing.T) {
	full := reconciler.StatusError(errors.New("policy map is full"))
	other := reconciler.StatusError(errors.New("permission denied"))
	row := func(id uint32, status reconciler.Status, policies ...string) *policy.Entry {
		return &policy.Entry{Key: policy.Key{Identity: identity.Number(id), Direction: policy.Egress}, Policies: policies, Status: status}
	}
	rows := []*policy.Entry{
		row(1, full, "a1"),
		row(2, full, "a1", "a2"), // both of a.yaml's: counts once
		row(3, other, "a2", "b1"),
		row(4, reconciler.StatusDone(), "b1"),
		row(5, reconciler.StatusPending(), "b1"),
		row(6, full, "gone"), // no file has it (any more)
	}
	seq := func(yield func(*policy.Entry, statedb.Revision) bool) {
		for i, r := range rows {
			if !yield(r, statedb.Revision(i)) {
				return
			}
		}
	}
	status := []fileStatus{
		{File: "a.yaml", Policies: []string{"a1", "a2"}},
		{File: "b.yaml", Policies: []string{"b1"}},
		{File: "c.yaml", Policies: []string{"c1"}},
	}
	got := notWrittenByFile(status, seq)
	require.Equal(t, []unwrittenEntries{
		{entries: 3, errors: []string{"permission denied", "policy map is full"}},
		{entries: 1, errors: []string{"permission denied"}},
		{},
	}, got)
	require.Equal(t, "3 policy entries not in the policy map (permission denied; policy map is full)", got[0].String())
	require.Equal(t, "1 policy entry not in the policy map", got[1].count())

	many := unwrittenEntries{entries: 5, errors: []string{"e1", "e2", "e3", "e4", "e5"}}
	require.Equal(t, "5 policy entries not in the policy map (e1; e2; e3; 2 more errors)", many.String())
}

// fakeDatapathMaps answers as the datapath's maps would: the policy map
// is looked up by longest prefix, as the LPM trie is.
type fakeDatapathMaps struct {
	identities map[netip.Addr]identity.Number
	policy     map[policy.Key]policy.Verdict
	// enforcement is the map's value: 1 default deny, 2 deny rules only.
	enforcement map[policy.Direction]int
	// failedRevs are the ipcache entries, by revision, whose write failed.
	failedRevs map[statedb.Revision]error
	// endpoints is the endpoints map: a local address's subject.
	endpoints map[netip.Addr]identity.Number
	// subjects is the enforcement of subjects other than 0.
	subjects map[identity.Number]map[policy.Direction]int
	err      error
}

func (m *fakeDatapathMaps) IPCacheStatus(rev statedb.Revision) (reconciler.StatusKind, error) {
	if err, failed := m.failedRevs[rev]; failed {
		return reconciler.StatusKindError, err
	}
	return reconciler.StatusKindDone, nil
}

func (m *fakeDatapathMaps) LookupIdentity(addr netip.Addr) (identity.Number, bool, error) {
	id, found := m.identities[addr]
	return id, found, m.err
}

func (m *fakeDatapathMaps) LookupPolicy(k policy.Key) (policy.Key, policy.Verdict, bool, error) {
	e, found := policy.LookupEntries(k, func(k policy.Key) (*policy.Entry, bool) {
		v, found := m.policy[k]
		return &policy.Entry{Key: k, Verdict: v}, found
	})
	if !found {
		return policy.Key{}, 0, false, m.err
	}
	return e.Key, e.Verdict, true, m.err
}

func (m *fakeDatapathMaps) LookupEndpoint(addr netip.Addr) (identity.Number, uint32, bool, error) {
	id, found := m.endpoints[addr]
	return id, 0, found, m.err
}

func (m *fakeDatapathMaps) Enforcement(subject identity.Number, dir policy.Direction) (policy.EnforcementMode, error) {
	if subject != identity.Unknown {
		return policy.EnforcementMode(m.subjects[subject][dir]), m.err
	}
	return policy.EnforcementMode(m.enforcement[dir]), m.err
}

func tcp(port uint16) policy.Lookup {
	return policy.Lookup{Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: port, HasPort: true}
}

// TestExplainMaps: the Maps line follows the program's lookups (the
// remote identity's and identity 0's, each by longest prefix; world when
// no ipcache entry covers the address; a deny wins) and says when the
// maps do not do what the policies want.
func TestExplainMaps(t *testing.T) {
	addr := netip.MustParseAddr("10.0.0.1")
	maps := &fakeDatapathMaps{
		identities: map[netip.Addr]identity.Number{addr: 16777217},
		policy: map[policy.Key]policy.Verdict{
			{Identity: 16777217, Direction: policy.Egress, Protocol: policy.ProtocolTCP, PortWildcardBits: 16}:             policy.VerdictAllow,
			{Identity: identity.World, Direction: policy.Egress}:                                                           policy.VerdictAllow,
			{Identity: 0, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 22}:                                policy.VerdictDeny,
			{Identity: 0, Direction: policy.Ingress, Protocol: policy.ProtocolTCP, Port: 8000, PortWildcardBits: 3}:        policy.VerdictDeny,
			{Identity: 16777217, Direction: policy.Ingress, Protocol: policy.ProtocolTCP, Port: 8000, PortWildcardBits: 2}: policy.VerdictAllow,
		},
		enforcement: map[policy.Direction]int{policy.Egress: 1, policy.Ingress: 2},
	}
	explainLine := func(addr netip.Addr, pkt policy.Lookup, desired bool) string {
		var out strings.Builder
		explainMaps(&out, maps, addr, pkt, desired, nil)
		return out.String()
	}
	require.Equal(t, "Maps: identity 16777217, egress enforced, policy map entry 16777217/egress/TCP/any: allow\n",
		explainLine(addr, tcp(443), true))
	require.Equal(t, "Maps: identity 16777217, egress enforced, policy map deny entry 0/egress/TCP/22: drop, not what the policies want\n",
		explainLine(addr, tcp(22), true), "identity 0's deny wins over the remote identity's allow")
	require.Equal(t, "Maps: identity 16777217, egress enforced, no policy map entry allows it: drop, not what the policies want\n",
		explainLine(addr, policy.Lookup{Direction: policy.Egress}, true), "without a port only the any-protocol entry matches")
	require.Equal(t, "Maps: identity 2, egress enforced, policy map entry 2/egress/any/any: allow, not what the policies want\n",
		explainLine(netip.MustParseAddr("192.0.2.1"), policy.Lookup{Direction: policy.Egress}, false), "no ipcache entry: world")
	in := tcp(8007)
	in.Direction = policy.Ingress
	require.Equal(t, "Maps: identity 16777217, ingress deny rules only, policy map deny entry 0/ingress/TCP/8000-8007: drop\n",
		explainLine(addr, in, false), "deny rules only: the block's deny")
	in.Port = 8008
	require.Equal(t, "Maps: identity 16777217, ingress deny rules only, no policy map entry denies it: allow\n",
		explainLine(addr, in, true))
	maps.enforcement[policy.Ingress] = 0
	require.Equal(t, "Maps: identity 16777217, ingress not enforced: allow\n", explainLine(addr, in, true))
	maps.err = errors.New("the pinned maps are not open")
	require.Equal(t, "Maps: cannot be read: the pinned maps are not open\n", explainLine(addr, tcp(1), true))
}

// TestExplainMapsEndpoint: for an endpoint, the Maps line reads the
// subject the endpoints map gives the endpoint's address of the peer's
// family, that subject's enforcement and its policy map; an address not
// in the endpoints map is the host-wide default's, as in the program.
func TestExplainMapsEndpoint(t *testing.T) {
	peer := netip.MustParseAddr("10.0.0.1")
	web := netip.MustParseAddr("10.9.0.1")
	maps := &fakeDatapathMaps{
		identities: map[netip.Addr]identity.Number{peer: 16777217},
		endpoints:  map[netip.Addr]identity.Number{web: 300},
		policy: map[policy.Key]policy.Verdict{
			{Subject: 300, Identity: 16777217, Direction: policy.Egress}: policy.VerdictAllow,
		},
		enforcement: map[policy.Direction]int{policy.Egress: 1},
		subjects:    map[identity.Number]map[policy.Direction]int{300: {policy.Egress: 1}, 301: {policy.Egress: 1}},
	}
	ep := &endpoint.State{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "web-1",
		Addresses: []netip.Addr{netip.MustParseAddr("fd00::1"), web}}, Identity: 300, Local: true}
	line := func(ep *endpoint.State, addr netip.Addr, desired bool) string {
		var out strings.Builder
		explainMaps(&out, maps, addr, policy.Lookup{Direction: policy.Egress, Subject: 300}, desired, ep)
		return out.String()
	}
	require.Equal(t, "Maps: 10.9.0.1 subject 300, identity 16777217, egress enforced, policy map entry 300:16777217/egress/any/any: allow\n",
		line(ep, peer, true))
	maps.subjects[300][policy.Egress] = int(policy.DropAll)
	require.Equal(t, "Maps: 10.9.0.1 subject 300, identity 16777217, egress drops everything (a deny has no room in the policy map): drop, not what the policies want\n",
		line(ep, peer, true), "the entry that allows it does not count")
	maps.subjects[300][policy.Egress] = int(policy.DefaultDeny)
	require.Equal(t, "Maps: identity 16777217, egress enforced, no policy map entry allows it: drop, not what the policies want\n",
		line(nil, peer, true), "the default's map has no entry")

	maps.endpoints[web] = 301
	require.Equal(t, "Maps: 10.9.0.1 subject 301 (not the endpoint's identity yet), identity 16777217, egress enforced, no policy map entry allows it: drop\n",
		line(ep, peer, false))
	delete(maps.endpoints, web)
	maps.enforcement[policy.Egress] = 0
	require.Equal(t, "Maps: 10.9.0.1 not in the endpoints map (the host-wide default's policy), identity 16777217, egress not enforced: allow, not what the policies want\n",
		line(ep, peer, false))

	v6only := &endpoint.State{Endpoint: endpoint.Endpoint{Namespace: "shop", Name: "v6",
		Addresses: []netip.Addr{netip.MustParseAddr("fd00::2")}}, Identity: 300, Local: true}
	require.Equal(t, "Maps: not read: shop/v6 has no address of 10.0.0.1's family\n", line(v6only, peer, true))
}

// TestExplainEntryNotWritten: an entry whose status is Error is said, with
// the verdict the program gives without it (another entry may still
// decide); a held ipcache entry leaves the address its previous identity,
// which the maps name; without the datapath there is no Maps line.
func TestExplainEntryNotWritten(t *testing.T) {
	db := statedb.New()
	ipcache, err := ipcachecell.NewEntriesTable(db)
	require.NoError(t, err)
	identities, err := identitycell.NewIdentitiesTable(db)
	require.NoError(t, err)
	entries, err := policy.NewEntryTable(db)
	require.NoError(t, err)
	enforcement, err := policy.NewEnforcementTable(db)
	require.NoError(t, err)
	policies, err := newPoliciesTable(db)
	require.NoError(t, err)
	require.NoError(t, db.Start())
	t.Cleanup(func() { require.NoError(t, db.Stop()) })

	full := reconciler.StatusError(errors.New("policy map is full"))
	txn := db.WriteTxn(ipcache, entries, enforcement, policies)
	for _, e := range []*ipcachecell.Entry{
		ipcachecell.NewEntry(netip.MustParsePrefix("10.0.0.0/24"), 16777217, 0),
		ipcachecell.NewEntry(netip.MustParsePrefix("10.0.1.0/24"), 16777218, 0),
		ipcachecell.NewEntry(netip.MustParsePrefix("10.0.2.0/24"), 16777217, 0),
	} {
		_, _, err := ipcache.Insert(txn, e)
		require.NoError(t, err)
	}
	_, _, err = policies.Insert(txn, &policy.Policy{Name: "p", File: "p.yaml", Line: 1, Egress: []policy.Rule{{Name: "egress[0]", Line: 3}}})
	require.NoError(t, err)
	for _, e := range []*policy.Entry{
		{Key: policy.Key{Identity: 16777217, Direction: policy.Egress}, Verdict: policy.VerdictAllow, Policies: []string{"p"}, Rules: []string{"p:egress[0]"}, Status: full},
		{Key: policy.Key{Identity: 16777218, Direction: policy.Egress, Protocol: policy.ProtocolTCP, Port: 443}, Verdict: policy.VerdictAllow, Policies: []string{"q"}, Rules: []string{"q:egress[1]"}, Status: full},
		{Key: policy.Key{Identity: 16777218, Direction: policy.Egress}, Verdict: policy.VerdictAllow, Policies: []string{"p"}, Rules: []string{"p:egress[0]"}, Status: reconciler.StatusDone()},
	} {
		_, _, err := entries.Insert(txn, e)
		require.NoError(t, err)
	}
	_, _, err = enforcement.Insert(txn, &policy.Enforcement{Direction: policy.Egress, Enforced: true})
	require.NoError(t, err)
	txn.Commit()
	_, heldRev, _ := ipcache.Get(db.ReadTxn(), ipcachecell.EntryIndex.Query(netip.MustParsePrefix("10.0.2.0/24")))

	maps := &fakeDatapathMaps{
		failedRevs: map[statedb.Revision]error{heldRev: errors.New("policy entries of the identity are not in the policy map")},
		identities: map[netip.Addr]identity.Number{
			netip.MustParseAddr("10.0.0.1"): 16777217,
			netip.MustParseAddr("10.0.2.1"): 16777220, // the held prefix's previous identity
		},
		policy:      map[policy.Key]policy.Verdict{{Identity: 16777220, Direction: policy.Egress}: policy.VerdictAllow},
		enforcement: map[policy.Direction]int{policy.Egress: 1},
	}
	run := func(datapath policy.Datapath, addr string, pkt policy.Lookup) string {
		src := explainSources{entries: entries, enforcement: enforcement, policies: policies, ipcache: ipcache,
			identities: identities, datapath: datapath, enablePolicy: EnablePolicyDefault}
		var out strings.Builder
		allowed := src.explainDesired(&out, db.ReadTxn(), netip.PrefixFrom(netip.MustParseAddr(addr), 32), pkt)
		if datapath != nil {
			explainMaps(&out, datapath, netip.MustParseAddr(addr), pkt, allowed, nil)
		}
		return out.String()
	}

	out := run(maps, "10.0.0.1", policy.Lookup{Direction: policy.Egress})
	require.Contains(t, out, "  16777217 any/any allow: p:egress[0] (p.yaml:3) (not in the policy map: policy map is full)\n")
	require.Contains(t, out, "Verdict: allow (entry 16777217/egress/any/any of p:egress[0] (p.yaml:3))\n")
	require.Contains(t, out, "Not written: entry 16777217/egress/any/any of p:egress[0] (p.yaml:3) (policy map is full) could not be written to the policy map\n")
	require.Contains(t, out, "Verdict without it: drop (no entry allows it)\n")
	require.Contains(t, out, "Maps: identity 16777217, egress enforced, no policy map entry allows it: drop, not what the policies want\n")

	out = run(nil, "10.0.1.1", tcp(443))
	require.Contains(t, out, "Verdict: allow (entry 16777218/egress/TCP/443 of q:egress[1])\n", "a policy not in the table is named by its rule alone")
	require.Contains(t, out, "Verdict without it: allow (entry 16777218/egress/any/any of p:egress[0] (p.yaml:3))\n",
		"the any entry allows what the port's unwritten entry does not")
	require.NotContains(t, out, "Maps:")

	out = run(maps, "10.0.2.1", policy.Lookup{Direction: policy.Egress})
	require.Contains(t, out, "; the datapath uses identity 16777220 for 10.0.2.1\n")
	require.Contains(t, out, "could not be written to the policy map; the datapath still uses the prefix's previous value (Datapath above)\n")
	require.Contains(t, out, "Maps: identity 16777220, egress enforced, policy map entry 16777220/egress/any/any: allow\n")
}
