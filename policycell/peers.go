// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"iter"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// peerLabels are what peer selectors by label, by entity and by DNS name
// match of an identity: its k8s labels (endpoint.KeyValues), the
// entities its reserved labels name, and its fqdn labels. Only
// identities with such labels have them: endpoint identities, the
// addresses of this node and other nodes (a cidr label and a reserved
// one), and the addresses the DNS proxy learned (a cidr label and the
// fqdn labels of the toFQDNs selectors that matched their name). A CIDR
// identity has none.
type peerLabels struct {
	kv       map[string]string
	entities []identity.Entity
	// fqdns are the identity's fqdn labels, whole ("fqdn:*.example.com").
	fqdns []string
}

// peerLabelsOf returns the peer labels of a label set, nil when it has
// only cidr labels (nearly every identity at scale, at the cost of one
// prefix test per label).
func peerLabelsOf(l labels.Labels) *peerLabels {
	if l.PrefixKey() != "" {
		// A CIDR identity's set, one cidr label alone (nearly every
		// identity at scale): nothing to select by, no text to render.
		return nil
	}
	var pl *peerLabels
	for lbl := range l.All() {
		if strings.HasPrefix(lbl, labels.SourceCIDR+":") {
			continue
		}
		if pl == nil {
			pl = &peerLabels{}
		}
		if name, ok := strings.CutPrefix(lbl, labels.SourceReserved+":"); ok {
			pl.entities = append(pl.entities, identity.Entity(name))
		}
		if strings.HasPrefix(lbl, fqdn.LabelSource+":") {
			pl.fqdns = append(pl.fqdns, lbl)
		}
	}
	if pl != nil {
		pl.kv = endpoint.KeyValues(l)
	}
	return pl
}

// peerGroup is one distinct peer selector (by label, by entity or by DNS
// name) and the selectors of the rules that use it: an identity is
// matched against each distinct selector once, however many rules share
// it, as Cilium's SelectorCache does.
type peerGroup struct {
	endpoints *policy.EndpointSelector // nil: entity or fqdn
	// fqdn is a toFQDNs selector's label (fqdn.Selector.Label, its
	// canonical form): the group selects the identities that have it.
	fqdn      string
	entity    identity.Entity
	selectors []*selector
}

// selects reports whether the group's selector selects identity id, whose
// peer labels are pl (nil if it has none).
func (g *peerGroup) selects(id identity.Number, pl *peerLabels) bool {
	switch {
	case g.endpoints != nil:
		return pl != nil && g.endpoints.SelectsPeer(pl.kv)
	case g.fqdn != "":
		return pl != nil && slices.Contains(pl.fqdns, g.fqdn)
	}
	return entitySelects(g.entity, id, pl)
}

// entitySelects reports whether an entity selects identity id: its
// reserved number, the identities labelled with its reserved label, and
// for cluster every endpoint identity and the cluster's entities.
func entitySelects(entity identity.Entity, id identity.Number, pl *peerLabels) bool {
	if entity == identity.EntityCluster {
		if pl != nil {
			if _, ok := pl.kv[policy.NamespaceLabel]; ok {
				return true
			}
		}
		for _, member := range identity.ClusterEntities() {
			if entitySelects(member, id, pl) {
				return true
			}
		}
		return false
	}
	if n, ok := entity.Reserved(); ok && n == id {
		return true
	}
	if pl == nil {
		return false
	}
	for _, e := range pl.entities {
		if e == entity {
			return true
		}
	}
	return false
}

// peerSet is the identities with peer labels, also by namespace.
type peerSet struct {
	all         map[identity.Number]*peerLabels
	byNamespace map[string]map[identity.Number]*peerLabels
}

func newPeerSet() peerSet {
	return peerSet{all: map[identity.Number]*peerLabels{}, byNamespace: map[string]map[identity.Number]*peerLabels{}}
}

// set records id's peer labels, nil when it has none (or is gone).
func (p *peerSet) set(id identity.Number, pl *peerLabels) {
	if old, ok := p.all[id]; ok {
		ns := namespaceOf(old)
		if delete(p.byNamespace[ns], id); len(p.byNamespace[ns]) == 0 {
			delete(p.byNamespace, ns)
		}
		delete(p.all, id)
	}
	if pl == nil {
		return
	}
	p.all[id] = pl
	ns := namespaceOf(pl)
	if p.byNamespace[ns] == nil {
		p.byNamespace[ns] = map[identity.Number]*peerLabels{}
	}
	p.byNamespace[ns][id] = pl
}

// selectable returns the identities g may select: those of its
// namespace, or all.
func (p *peerSet) selectable(g *peerGroup) map[identity.Number]*peerLabels {
	if ns := g.namespace(); ns != "" {
		return p.byNamespace[ns]
	}
	return p.all
}

// reservedPeers are the reserved numbers entities select: no identity row
// has them, so they are recomputed when an entity selector changes.
func reservedPeers() []identity.Number {
	return []identity.Number{identity.Host, identity.Unmanaged, identity.Health, identity.Init,
		identity.RemoteNode, identity.KubeAPIServer, identity.Ingress}
}

// isReservedPeer reports whether id is one of reservedPeers.
func isReservedPeer(id identity.Number) bool {
	return id >= identity.Host && id <= identity.Ingress && id != identity.World
}

// peerIndex holds the peer selectors by label and by entity of the
// policies in force, grouped by distinct selector, and also by the
// namespace a selector is restricted to ("" for the others and the
// entities): an identity is matched against the groups of its namespace
// and those of none, not against every namespace's.
type peerIndex struct {
	groups      map[string]*peerGroup
	byNamespace map[string]map[string]*peerGroup
}

func newPeerIndex() peerIndex {
	return peerIndex{groups: map[string]*peerGroup{}, byNamespace: map[string]map[string]*peerGroup{}}
}

// namespace is the namespace a group's selector is restricted to, "" for
// none (and for an entity).
func (g *peerGroup) namespace() string {
	if g.endpoints == nil {
		return ""
	}
	return g.endpoints.Namespace
}

// namespaceOf is the namespace of an identity's peer labels, "" for none.
func namespaceOf(pl *peerLabels) string {
	if pl == nil {
		return ""
	}
	return pl.kv[policy.NamespaceLabel]
}

// candidates yields the groups that may select an identity whose peer
// labels are pl: those of its namespace and those of none.
func (x *peerIndex) candidates(pl *peerLabels) iter.Seq[*peerGroup] {
	return func(yield func(*peerGroup) bool) {
		namespaces := []string{""}
		if ns := namespaceOf(pl); ns != "" {
			namespaces = append(namespaces, ns)
		}
		for _, ns := range namespaces {
			for _, g := range x.byNamespace[ns] {
				if !yield(g) {
					return
				}
			}
		}
	}
}

// hasRulePeers reports whether a rule has peers by label, by entity or
// by DNS name (rulePeers).
func hasRulePeers(rule *policy.Rule) bool {
	return len(rule.Endpoints) > 0 || len(rule.Entities) > 0 || (rule.FQDN != nil && len(rule.FQDN.Selectors) > 0)
}

// rulePeers returns a rule's peers by label, by entity and by DNS name,
// each as a group of its own (without selectors), keyed as the index
// keys them.
func rulePeers(rule *policy.Rule) map[string]*peerGroup {
	groups := map[string]*peerGroup{}
	for i := range rule.Endpoints {
		sel := &rule.Endpoints[i]
		// String is a selector's canonical form: label keys and values
		// cannot hold the characters it separates them with.
		groups["endpoints "+sel.String()] = &peerGroup{endpoints: sel}
	}
	for _, entity := range rule.Entities {
		groups["entity "+string(entity)] = &peerGroup{entity: entity}
	}
	if rule.FQDN != nil {
		for _, sel := range rule.FQDN.Selectors {
			// Two spellings of one selector are one label, one group.
			groups["fqdn "+sel.Label()] = &peerGroup{fqdn: sel.Label()}
		}
	}
	return groups
}

// add indexes the label, entity and DNS name peers of a rule, whose selector is s
// (s.peer nil), and returns the groups it joined.
func (x *peerIndex) add(s *selector, rule *policy.Rule) []*peerGroup {
	var joined []*peerGroup
	for key, peer := range rulePeers(rule) {
		g, ok := x.groups[key]
		if !ok {
			g = peer
			x.groups[key] = g
			ns := g.namespace()
			if x.byNamespace[ns] == nil {
				x.byNamespace[ns] = map[string]*peerGroup{}
			}
			x.byNamespace[ns][key] = g
		}
		g.selectors = append(g.selectors, s)
		joined = append(joined, g)
	}
	return joined
}

// remove drops the policy's selectors, and the groups left empty; it
// returns the groups the policy was in.
func (x *peerIndex) remove(pol string) []*peerGroup {
	var left []*peerGroup
	for key, g := range x.groups {
		n := len(g.selectors)
		g.selectors = deleteSelectorsOf(g.selectors, pol)
		if len(g.selectors) == n {
			continue
		}
		left = append(left, g)
		if len(g.selectors) == 0 {
			delete(x.groups, key)
			ns := g.namespace()
			if delete(x.byNamespace[ns], key); len(x.byNamespace[ns]) == 0 {
				delete(x.byNamespace, ns)
			}
		}
	}
	return left
}

func deleteSelectorsOf(selectors []*selector, pol string) []*selector {
	out := selectors[:0]
	for _, s := range selectors {
		if s.policy != pol {
			out = append(out, s)
		}
	}
	clear(selectors[len(out):])
	return out
}

// empty reports whether no peer selector is indexed.
func (x *peerIndex) empty() bool { return len(x.groups) == 0 }
