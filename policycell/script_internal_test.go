package policycell

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
)

// TestNotWrittenByFile: a file counts the rows of its policies whose
// status is Error, once per row even if several of its policies share it,
// with each distinct error once; rows Done or Pending do not count.
func TestNotWrittenByFile(t *testing.T) {
	full := reconciler.StatusError(errors.New("policy map is full"))
	other := reconciler.StatusError(errors.New("permission denied"))
	row := func(id uint32, status reconciler.Status, policies ...string) *PolicyEntry {
		return &PolicyEntry{Key: PolicyKey{Identity: identitycell.NumericIdentity(id), Direction: Egress}, Policies: policies, Status: status}
	}
	rows := []*PolicyEntry{
		row(1, full, "a1"),
		row(2, full, "a1", "a2"), // both of a.yaml's: counts once
		row(3, other, "a2", "b1"),
		row(4, reconciler.StatusDone(), "b1"),
		row(5, reconciler.StatusPending(), "b1"),
		row(6, full, "gone"), // no file has it (any more)
	}
	seq := func(yield func(*PolicyEntry, statedb.Revision) bool) {
		for i, r := range rows {
			if !yield(r, statedb.Revision(i)) {
				return
			}
		}
	}
	status := []FileStatus{
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

// fakeDatapathMaps answers as the datapath's maps would.
type fakeDatapathMaps struct {
	identities map[netip.Addr]identitycell.NumericIdentity
	policy     map[PolicyKey]Verdict
	enforced   map[Direction]bool
	err        error
}

func (m *fakeDatapathMaps) LookupIdentity(addr netip.Addr) (identitycell.NumericIdentity, bool, error) {
	id, found := m.identities[addr]
	return id, found, m.err
}

func (m *fakeDatapathMaps) LookupPolicy(k PolicyKey) (Verdict, bool, error) {
	v, found := m.policy[k]
	return v, found, m.err
}

func (m *fakeDatapathMaps) Enforced(dir Direction) (bool, error) { return m.enforced[dir], m.err }

// TestExplainMaps: the Maps line follows the program's lookups (exact
// port, the protocol's any port, any protocol; world when no ipcache entry
// covers the address) and says when the maps do not do what the policies
// want.
func TestExplainMaps(t *testing.T) {
	addr := netip.MustParseAddr("10.0.0.1")
	maps := &fakeDatapathMaps{
		identities: map[netip.Addr]identitycell.NumericIdentity{addr: 16777217},
		policy: map[PolicyKey]Verdict{
			{Identity: 16777217, Direction: Egress, Protocol: ProtocolTCP}: VerdictAllow,
			{Identity: identitycell.IdentityWorld, Direction: Egress}:      VerdictAllow,
		},
		enforced: map[Direction]bool{Egress: true},
	}
	explainLine := func(addr netip.Addr, dir Direction, exact PolicyKey, desired bool) string {
		var out strings.Builder
		explainMaps(&out, maps, addr, dir, exact, desired)
		return out.String()
	}
	tcp443 := PolicyKey{Protocol: ProtocolTCP, Port: 443}
	require.Equal(t, "Maps: identity 16777217, egress enforced, policy map entry 16777217/egress/TCP/0: allow\n",
		explainLine(addr, Egress, tcp443, true))
	require.Equal(t, "Maps: identity 16777217, egress enforced, no policy map entry allows it: drop, not what the policies want\n",
		explainLine(addr, Egress, PolicyKey{}, true), "without a port only the any-protocol entry is looked up")
	require.Equal(t, "Maps: identity 2, egress enforced, policy map entry 2/egress/any/0: allow, not what the policies want\n",
		explainLine(netip.MustParseAddr("192.0.2.1"), Egress, PolicyKey{}, false), "no ipcache entry: world")
	require.Equal(t, "Maps: identity 16777217, ingress not enforced: allow\n", explainLine(addr, Ingress, PolicyKey{}, true))
	maps.err = errors.New("the pinned maps are not open")
	require.Equal(t, "Maps: cannot be read: the pinned maps are not open\n", explainLine(addr, Egress, PolicyKey{}, true))
}
