// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// checkReferences checks, in one snapshot, what holds at every moment (the
// resolver writes the `ipcache` table and the identities in one
// transaction): every identity's reference count is the number of
// non-explicit entries mapped to it (in the whole agent, the ipcache is the
// only holder of references), and no identity is allocated that no entry
// uses. It returns "" or the first violation.
func (a *agent) checkReferences() string {
	txn := a.db.ReadTxn()
	refs := map[identity.Number]uint32{}
	for e := range a.entries.All(txn) {
		if e.Explicit {
			continue
		}
		if ident, _, found := a.identities.Get(txn, identitycell.IdentityIndex.Query(e.Identity)); !found || !ident.Allocated() {
			return fmt.Sprintf("entry %s maps to identity %d, which is not allocated", e.Prefix(), e.Identity)
		}
		refs[e.Identity]++
	}
	n := 0
	for id := range a.identities.All(txn) {
		if !id.Allocated() {
			continue // only a tool builds such a row
		}
		n++
		if id.References() != refs[id.ID] {
			return fmt.Sprintf("identity %d (%s) has %d references, %d entries use it", id.ID, id.Labels, id.References(), refs[id.ID])
		}
	}
	if n != len(refs) {
		return fmt.Sprintf("%d identities allocated, %d used by entries", n, len(refs))
	}
	return ""
}

// expectedEntry is what the `ipcache` entry of a prefix must say.
type expectedEntry struct {
	source   source.Source
	labels   labels.Labels
	explicit identity.Number
	// explicitSource is the source that set explicit.
	explicitSource source.Source
}

// model is what the agent must converge to for the churn's current state.
type model struct {
	policies map[string]*policy.Policy                        // in force, by name
	metadata map[string]map[netip.Prefix]ipcachecell.Metadata // by resource
	sources  map[string]source.Source                         // by resource
	entries  map[netip.Prefix]*expectedEntry
}

// model returns what the agent must converge to. Every file must be valid
// (see fixInvalidFiles).
func (c *churn) model() *model {
	m := &model{
		policies: map[string]*policy.Policy{},
		metadata: map[string]map[netip.Prefix]ipcachecell.Metadata{},
		sources:  map[string]source.Source{},
		entries:  map[netip.Prefix]*expectedEntry{},
	}
	for name, f := range c.files {
		if !f.valid {
			c.t.Fatalf("model of an invalid file %s", name)
		}
		for _, p := range f.policies {
			m.policies[p.Name] = p
			said := map[netip.Prefix]ipcachecell.Metadata{}
			for _, prefix := range p.Prefixes() {
				said[prefix] = ipcachecell.Metadata{Labels: labels.ForPrefix(prefix)}
			}
			if len(said) > 0 {
				m.metadata[p.Resource()], m.sources[p.Resource()] = said, source.Directory
			}
		}
	}
	for _, o := range c.owners {
		if len(o.said) > 0 {
			m.metadata[o.resource], m.sources[o.resource] = maps.Clone(o.said), o.source
		}
	}
	// Resources in name order: among equal sources the first wins (only
	// the policies share a source, and they set no explicit identity).
	for _, resource := range slices.Sorted(maps.Keys(m.metadata)) {
		src := m.sources[resource]
		for prefix, md := range m.metadata[resource] {
			e := m.entries[prefix]
			if e == nil {
				e = &expectedEntry{source: src, labels: labels.ForPrefix(prefix)}
				m.entries[prefix] = e
			}
			e.labels = e.labels.Union(md.Labels)
			if src.Overrides(e.source) {
				e.source = src
			}
			if md.ExplicitIdentity != 0 && (e.explicit == 0 || src.Overrides(e.explicitSource)) {
				e.explicit, e.explicitSource = md.ExplicitIdentity, src
			}
		}
	}
	return m
}

// checkConverged compares the agent with the model: the `policies`,
// `ipcache-metadata`, `ipcache`, `identities`, `policy` and
// `policy-enforcement` tables, every entry reconciled, and the pinned
// ipcache and policy maps. It returns "" or the first difference.
func (a *agent) checkConverged(m *model) string {
	txn := a.db.ReadTxn()

	// Policies in force.
	n := 0
	for p := range a.policies.All(txn) {
		n++
		want := m.policies[p.Name]
		switch {
		case want == nil:
			return fmt.Sprintf("policy %s (%s) in force, not in any file", p.Name, p.File)
		case want.File != p.File || !reflect.DeepEqual(want.Ingress, p.Ingress) || !reflect.DeepEqual(want.Egress, p.Egress):
			return fmt.Sprintf("policy %s in force is not the version on disk", p.Name)
		}
	}
	if n != len(m.policies) {
		return fmt.Sprintf("%d policies in force, want %d", n, len(m.policies))
	}

	// Metadata.
	n = 0
	for row := range a.metadata.All(txn) {
		n++
		md, ok := m.metadata[row.Resource()][row.Prefix()]
		switch {
		case !ok:
			return fmt.Sprintf("metadata %s of %s that the resource does not have", row.Prefix(), row.Resource())
		case md != row.Metadata() || m.sources[row.Resource()] != row.Source():
			return fmt.Sprintf("metadata %s of %s is %+v (%s), want %+v", row.Prefix(), row.Resource(), row.Metadata(), row.Source(), md)
		}
	}
	want := 0
	for _, said := range m.metadata {
		want += len(said)
	}
	if n != want {
		return fmt.Sprintf("%d metadata rows, want %d", n, want)
	}

	// Entries, their identities and the pinned ipcache map.
	labelsOf := func(id identity.Number) labels.Labels {
		ident, _, _ := a.identities.Get(txn, identitycell.IdentityIndex.Query(id))
		if ident == nil {
			return labels.Labels{}
		}
		return ident.Labels
	}
	n = 0
	for e, rev := range a.entries.All(txn) {
		n++
		w := m.entries[e.Prefix()]
		kind, writeErr := a.datapath.IPCacheStatus(rev)
		switch {
		case w == nil:
			return fmt.Sprintf("ipcache entry %s that nobody owns", e.Prefix())
		case e.Source != w.source:
			return fmt.Sprintf("ipcache entry %s has source %s, want %s", e.Prefix(), e.Source, w.source)
		case w.explicit != 0 && (!e.Explicit || e.Identity != w.explicit):
			return fmt.Sprintf("ipcache entry %s is %d (explicit %t), want explicit %d", e.Prefix(), e.Identity, e.Explicit, w.explicit)
		case w.explicit == 0 && (e.Explicit || labelsOf(e.Identity) != w.labels):
			return fmt.Sprintf("ipcache entry %s has identity %d with labels %s (explicit %t), want %s", e.Prefix(), e.Identity, labelsOf(e.Identity), e.Explicit, w.labels)
		case kind != reconciler.StatusKindDone:
			return fmt.Sprintf("ipcache entry %s not reconciled: %s %v", e.Prefix(), kind, writeErr)
		}
	}
	if n != len(m.entries) {
		return fmt.Sprintf("%d ipcache entries, want %d", n, len(m.entries))
	}
	if problem := a.checkReferences(); problem != "" {
		return problem
	}
	pinned, err := bpfmaps.ReadIPCache(a.BPFRoot)
	if err != nil {
		return err.Error()
	}
	for e := range a.entries.All(txn) {
		if id, ok := pinned[e.Prefix()]; !ok || id != e.Identity {
			return fmt.Sprintf("pinned ipcache map has %s -> %d (present %t), the table %d", e.Prefix(), id, ok, e.Identity)
		}
	}
	if len(pinned) != n {
		return fmt.Sprintf("pinned ipcache map has %d entries, the table %d", len(pinned), n)
	}

	// The policy table against a computation from scratch, and the pinned
	// policy map.
	if rev := a.identities.Revision(txn); a.bruteForceModel != m || a.bruteForceRevision != rev {
		a.bruteForceResult = bruteForce(slices.Collect(maps.Values(m.policies)), statedb.Collect(a.identities.All(txn)))
		a.bruteForceModel, a.bruteForceRevision = m, rev
	}
	wantPolicy := a.bruteForceResult
	n = 0
	for e := range a.policy.All(txn) {
		n++
		names, ok := wantPolicy[e.Key]
		switch {
		case !ok:
			return fmt.Sprintf("policy entry %s that no policy allows", e.Key)
		case names != strings.Join(e.Policies, ","):
			return fmt.Sprintf("policy entry %s names %v, want %s", e.Key, e.Policies, names)
		case e.Status.Kind != reconciler.StatusKindDone:
			return fmt.Sprintf("policy entry %s not reconciled: %s", e.Key, e.Status)
		}
	}
	if n != len(wantPolicy) {
		return fmt.Sprintf("%d policy entries, want %d", n, len(wantPolicy))
	}
	pinnedPolicy, err := bpfmaps.ReadPolicy(a.BPFRoot)
	if err != nil {
		return err.Error()
	}
	for e := range a.policy.All(txn) {
		k := bpfmaps.NewPolicyKey(e.Key)
		if v, ok := pinnedPolicy[k]; !ok || v != uint32(e.Verdict) {
			return fmt.Sprintf("pinned policy map has %s -> %d (present %t)", e.Key, v, ok)
		}
	}
	if len(pinnedPolicy) != n {
		return fmt.Sprintf("pinned policy map has %d entries, the table %d", len(pinnedPolicy), n)
	}

	// Enforcement.
	wantEnforced := map[policy.Direction]bool{}
	for _, p := range m.policies {
		for _, dir := range policy.Directions() {
			wantEnforced[dir] = wantEnforced[dir] || len(p.Rules(dir)) > 0
		}
	}
	n = 0
	for e := range a.enforcement.All(txn) {
		n++
		if e.Enforced != wantEnforced[e.Direction] || e.Status.Kind != reconciler.StatusKindDone {
			return fmt.Sprintf("enforcement of %s is %t (%s), want %t", e.Direction, e.Enforced, e.Status, wantEnforced[e.Direction])
		}
	}
	if n != 2 {
		return fmt.Sprintf("%d enforcement rows, want 2", n)
	}
	return ""
}

// bruteForce computes the `policy` table from scratch: each rule's peers
// against world and every identity's cidr labels (as policycell's own
// TestSelectorMatchesBruteForce does).
func bruteForce(policies []*policy.Policy, identities []*identitycell.Identity) map[policy.Key]string {
	type target struct {
		id       identity.Number
		prefixes []netip.Prefix
	}
	targets := []target{{identity.World, []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}}
	for _, i := range identities {
		targets = append(targets, target{i.ID, slices.Collect(i.Labels.Prefixes())})
	}
	allowed := map[policy.Key]map[string]struct{}{}
	for _, p := range policies {
		for _, dir := range policy.Directions() {
			for _, rule := range p.Rules(dir) {
				for _, peer := range rule.Peers {
					for _, t := range targets {
						if !peer.Selects(t.prefixes) {
							continue
						}
						k := policy.Key{Identity: t.id, Direction: dir}
						keys := []policy.Key{k}
						if len(rule.Ports) > 0 {
							keys = keys[:0]
							for _, pp := range rule.Ports {
								k.Protocol, k.Port = pp.Protocol, pp.Port
								keys = append(keys, k)
							}
						}
						for _, k := range keys {
							if allowed[k] == nil {
								allowed[k] = map[string]struct{}{}
							}
							allowed[k][p.Name] = struct{}{}
						}
					}
				}
			}
		}
	}
	out := map[policy.Key]string{}
	for k, names := range allowed {
		out[k] = strings.Join(slices.Sorted(maps.Keys(names)), ",")
	}
	return out
}

// lifetimes counts, from change iterators, how many ipcache entries,
// identities and policy entries were deleted (each deletion ends one
// lifetime: a prefix that comes back later is a new lifetime), and how many
// changes of entries there were in all.
type lifetimes struct {
	mu                                 sync.Mutex
	entries, identities, policyEntries int
	entryChanges                       int
}

// countLifetimes observes the tables until ctx is done; the returned
// function waits for that and closes the iterators.
func (a *agent) countLifetimes(ctx context.Context) (*lifetimes, func()) {
	l := &lifetimes{}
	txn := a.db.WriteTxn(a.entries, a.identities, a.policy)
	entries, err1 := a.entries.Changes(txn)
	identities, err2 := a.identities.Changes(txn)
	pol, err3 := a.policy.Changes(txn)
	txn.Commit()
	if err1 != nil || err2 != nil || err3 != nil {
		a.t.Fatalf("observe tables: %v %v %v", err1, err2, err3)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer entries.Close()
		defer identities.Close()
		defer pol.Close()
		for stopping := false; ; {
			rtxn := a.db.ReadTxn()
			var e, i, p, changes int
			seq, w1 := entries.Next(rtxn)
			for ch := range seq {
				changes++
				if ch.Deleted {
					e++
				}
			}
			seqIDs, w2 := identities.Next(rtxn)
			for ch := range seqIDs {
				if ch.Deleted {
					i++
				}
			}
			seqPolicy, w3 := pol.Next(rtxn)
			for ch := range seqPolicy {
				if ch.Deleted {
					p++
				}
			}
			l.mu.Lock()
			l.entries += e
			l.identities += i
			l.policyEntries += p
			l.entryChanges += changes
			l.mu.Unlock()
			if stopping {
				return
			}
			select {
			case <-ctx.Done():
				stopping = true // one more round, for what came before
			case <-w1:
			case <-w2:
			case <-w3:
			}
		}
	}()
	return l, func() { <-done }
}

func (l *lifetimes) get() (entries, identities, policyEntries, entryChanges int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.entries, l.identities, l.policyEntries, l.entryChanges
}
