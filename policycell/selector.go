// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// entryBound is how many times the policy map's size the `policy` table
// may hold: beyond the map's size, rows show as not written (status
// Error); beyond this, entries are not computed at all, so the table's
// memory does not grow with what the policies select.
const entryBound = 2

// writeChunkSize bounds the identities whose entries are written in one
// transaction, so that a large change does not block the datapath's
// reconciler (which writes statuses into the same table) for long.
const writeChunkSize = 4096

// selector is one CIDR selector of one rule of a policy in force, or
// (peer nil) a rule's selector of every peer: identity 0's. What it has
// of the rule is shared by the rule's selectors: a rule may have a
// hundred thousand CIDRs, and a selector is then two pointers.
type selector struct {
	*ruleSelector
	peer *policy.CIDRSelector
}

// ruleSelector is what a rule's selectors have in common.
type ruleSelector struct {
	policy    string
	rule      string // RuleRef
	direction policy.Direction
	deny      bool
	ports     []policy.PortRange
	// source is the rule, for errors that point at it.
	source *policy.Rule
}

func newRuleSelector(p *policy.Policy, dir policy.Direction, rule *policy.Rule) *ruleSelector {
	return &ruleSelector{policy: p.Name, rule: policy.RuleRef(p.Name, rule.Name), direction: dir, deny: rule.Deny,
		ports: rule.Ports, source: rule}
}

// selectorIndex finds the selectors of an identity without looking at
// the others: selectors by their CIDR (a hash map), probed at each prefix
// length of the identity's prefixes that some selector has. Both the
// selector engine and the count of a file's entries (expansion.go) use it.
type selectorIndex struct {
	byCIDR map[netip.Prefix][]*selector
	// room is the number of CIDRs byCIDR was last made for (reserve).
	room int
	// lengths counts the selector CIDRs of each family (IPv4, IPv6) and
	// prefix length.
	lengths [2][129]int
	// anyPeer are the selectors of rules for every peer: they give the
	// entries of identity 0 (any identity).
	anyPeer []*selector
}

func newSelectorIndex() selectorIndex {
	return selectorIndex{byCIDR: map[netip.Prefix][]*selector{}}
}

// add indexes a selector.
func (x *selectorIndex) add(s *selector) {
	if s.peer == nil {
		x.anyPeer = append(x.anyPeer, s)
		return
	}
	cidr := s.peer.CIDR
	if len(x.byCIDR[cidr]) == 0 {
		x.lengths[family(cidr)][cidr.Bits()]++
	}
	x.byCIDR[cidr] = append(x.byCIDR[cidr], s)
}

// addPeers indexes the selectors of a rule's CIDR peers. They are made
// in one allocation and share the rule's part: a rule may have a hundred
// thousand CIDRs.
func (x *selectorIndex) addPeers(p *policy.Policy, dir policy.Direction, rule *policy.Rule) {
	if len(rule.Peers) == 0 {
		return
	}
	shared := newRuleSelector(p, dir, rule)
	selectors := make([]selector, len(rule.Peers))
	for j := range rule.Peers {
		s := &selectors[j]
		*s = selector{ruleSelector: shared, peer: &rule.Peers[j]}
		x.add(s)
	}
}

// reserve makes room for n more CIDRs when they are at least as many as
// those indexed (a policy directory's first read, a large file) and the
// map was not made with room for them: the map is made at its size once,
// where growing it step by step moved what it held at each step; copying
// what it holds costs no more than adding n.
func (x *selectorIndex) reserve(n int) {
	if n < len(x.byCIDR) || n < 64 || len(x.byCIDR)+n <= x.room {
		return
	}
	x.room = len(x.byCIDR) + n
	grown := make(map[netip.Prefix][]*selector, x.room)
	maps.Copy(grown, x.byCIDR)
	x.byCIDR = grown
}

// cidrPeers counts the CIDR peers of a policy's rules.
func cidrPeers(p *policy.Policy) int {
	n := 0
	for _, dir := range policy.Directions() {
		for _, rule := range p.Rules(dir) {
			n += len(rule.Peers)
		}
	}
	return n
}

// removeCIDR removes the policy's selectors on cidr (nothing if they are
// already gone: a second selector of the policy on the same CIDR).
func (x *selectorIndex) removeCIDR(pol string, cidr netip.Prefix) {
	at, ok := x.byCIDR[cidr]
	if !ok {
		return
	}
	at = slices.DeleteFunc(at, func(s *selector) bool { return s.policy == pol })
	if len(at) == 0 {
		delete(x.byCIDR, cidr)
		x.lengths[family(cidr)][cidr.Bits()]--
	} else {
		x.byCIDR[cidr] = at
	}
}

// removeAnyPeer removes the policy's selectors of every peer.
func (x *selectorIndex) removeAnyPeer(pol string) {
	x.anyPeer = slices.DeleteFunc(x.anyPeer, func(s *selector) bool { return s.policy == pol })
}

// empty reports whether no selector is indexed.
func (x *selectorIndex) empty() bool { return len(x.byCIDR) == 0 && len(x.anyPeer) == 0 }

// candidates yields the CIDR selectors whose CIDR contains one of the
// prefixes (an identity's), except prefixes not checked: the caller
// checks them (CIDRSelector.excludes), against all of the identity's
// prefixes.
func (x *selectorIndex) candidates(prefixes []netip.Prefix) iter.Seq[*selector] {
	return func(yield func(*selector) bool) {
		for _, prefix := range prefixes {
			lengths := &x.lengths[family(prefix)]
			for bits := prefix.Bits(); bits >= 0; bits-- {
				if lengths[bits] == 0 {
					continue
				}
				cidr, _ := prefix.Addr().Prefix(bits)
				for _, s := range x.byCIDR[cidr] {
					if !yield(s) {
						return
					}
				}
			}
		}
	}
}

// selectorEngine computes the desired `policy` and `policy-enforcement`
// tables from the policies in force and the identities, incrementally.
//
// Two indexes make each change cost what it selects, not what exists:
//   - selectors by their CIDR (a hash map). The selectors of an identity
//     are found by probing each prefix length of each of its cidr prefixes
//     (only lengths some selector has): the cost of an identity appearing
//     does not grow with the policies that do not select it.
//   - identities by cidr prefix: the `identities` table's labels index is
//     keyed by cidr prefix first (identitycell.IdentitiesWithin), so the
//     identities inside a CIDR are one key range: a policy change looks up
//     only the identities inside its CIDRs. The engine keeps no copy of it
//     (a copy's memory grows with the identities: docs/SCALE.md).
//
// Each change marks identities dirty; the entries of a dirty identity are
// recomputed from its labels in the table and the selectors, and written
// as a diff, so an unchanged entry keeps its reconciliation status. A
// changed identity row is dirty whatever changed: a number freed and taken
// again by other labels between two rounds is one change, not a deletion
// and an insertion, and recomputing is what keeps that right.
//
// Entries are per subject: the local endpoint identity whose policy they
// are in, 0 for the host-wide default. A policy applies to the subjects
// its endpoint selector matches (subject 0 when the selector is empty);
// the engine keeps the subjects of each policy, so a remote identity's
// entries are computed for every subject of the policies that select it.
// An endpoint row appearing, changing identity or going changes the
// subjects only when the first endpoint of an identity appears or its
// last one goes: then the selectors are matched against that one
// identity's labels, and the remote identities of the policies it gains
// or loses are marked dirty. Endpoints of one identity share everything.
type selectorEngine struct {
	db          *statedb.DB
	policies    statedb.Table[*policy.Policy]
	identities  statedb.Table[*identitycell.Identity]
	ipcache     statedb.Table[*ipcachecell.Entry]
	entries     statedb.RWTable[*policy.Entry]
	enforcement statedb.RWTable[*policy.Enforcement]
	progress    *SelectorProgress
	log         *slog.Logger

	// markInitialized marks both tables initialized; nil once done.
	markInitialized func(statedb.WriteTxn)

	policyChanges   statedb.ChangeIterator[*policy.Policy]
	identityChanges statedb.ChangeIterator[*identitycell.Identity]
	// seen are the revisions of the last change of each table processed:
	// the progress tells them, not the snapshot's revisions, because a
	// commit is visible in a snapshot before it wakes the change
	// iterators, which until then yield none of its changes.
	seen struct{ policies, identities, endpoints statedb.Revision }

	// endpoints is the `endpoints` table, nil in a hive without an
	// endpoint cell (then subject 0 is the only one).
	endpoints       statedb.Table[*endpoint.State]
	endpointChanges statedb.ChangeIterator[*endpoint.State]
	// endpointIdentity is the identity of each local endpoint in force, by
	// name; subjects the local endpoint identities, with their labels and
	// how many endpoints have them.
	endpointIdentity map[string]identity.Number
	subjects         map[identity.Number]*subject
	// selected are the subjects of each indexed policy; counts the
	// policies of each subject (0 included) that make a direction
	// enforced or have deny rules in it. goneSubjects have enforcement
	// rows to delete.
	selected     map[string]map[identity.Number]struct{}
	counts       map[identity.Number]*enforcementCounts
	goneSubjects map[identity.Number]struct{}

	// indexed are the policies whose selectors are in index, by name.
	// Identity 0 (the rules for every peer) is not in the identities
	// table: it is recomputed when its selectors change.
	indexed map[string]*policy.Policy
	index   selectorIndex

	// peerIndex holds the peer selectors by label, by entity and by DNS
	// name, and peers the identities they can select (those with k8s,
	// reserved or fqdn labels), with those labels: a new peer selector is matched against
	// these alone, and a new identity against each distinct selector.
	peerIndex peerIndex
	peers     peerSet

	// enablePolicy is --enable-policy.
	enablePolicy string

	// dnsRules is the `dns-rules` table, nil when the engine writes none
	// (tests of the entries alone). dnsPolicies are the indexed policies
	// with DNS rules in egress, by name; dnsDirty the subjects whose row
	// to recompute.
	dnsRules    statedb.RWTable[*policy.DNSRules]
	dnsPolicies map[string]*policy.Policy
	dnsDirty    map[identity.Number]struct{}

	dirty map[identity.Number]struct{}

	// maxEntries bounds the rows of the `policy` table (entryBound times
	// the policy map's size): each file fits the map (CountEntries), but
	// files together, or one file's CIDR with another's many narrower
	// prefixes, may compute more than it holds, and no more than that
	// bound is ever held. notComputed are the identities whose entries did
	// not all fit under it, with how many did not; they are recomputed
	// when room appears.
	maxEntries  int
	notComputed map[identity.Number]int

	// onePrefix holds the prefix prefixesOf returns for a prefix's own
	// identity.
	onePrefix [1]netip.Prefix

	// visited counts the selectors examined, recomputed the identities
	// whose entries were recomputed, passes the passes over all
	// identities (markIndexedWithin); tests use them to show what a change
	// costs.
	visited, recomputed, passes int
}

func newSelectorEngine(db *statedb.DB, policies statedb.Table[*policy.Policy], identities statedb.Table[*identitycell.Identity],
	ipcache statedb.Table[*ipcachecell.Entry], entries statedb.RWTable[*policy.Entry], enforcement statedb.RWTable[*policy.Enforcement],
	progress *SelectorProgress, log *slog.Logger, enablePolicy string) *selectorEngine {
	txn := db.WriteTxn(entries, enforcement)
	markEntries := entries.RegisterInitializer(txn, "policy-selectors")
	markEnforcement := enforcement.RegisterInitializer(txn, "policy-selectors")
	txn.Commit()
	e := &selectorEngine{
		db:          db,
		policies:    policies,
		identities:  identities,
		ipcache:     ipcache,
		entries:     entries,
		enforcement: enforcement,
		progress:    progress,
		log:         log,
		markInitialized: func(txn statedb.WriteTxn) {
			markEntries(txn)
			markEnforcement(txn)
		},
		indexed:   map[string]*policy.Policy{},
		index:     newSelectorIndex(),
		peerIndex: newPeerIndex(),
		peers:     newPeerSet(),

		endpointIdentity: map[string]identity.Number{},
		subjects:         map[identity.Number]*subject{},
		selected:         map[string]map[identity.Number]struct{}{},
		counts:           map[identity.Number]*enforcementCounts{0: {}},
		goneSubjects:     map[identity.Number]struct{}{},
		dirty:            map[identity.Number]struct{}{},
		dnsPolicies:      map[string]*policy.Policy{},
		dnsDirty:         map[identity.Number]struct{}{},
		maxEntries:       entryBound * DefaultPolicyMapMaxEntries,
		notComputed:      map[identity.Number]int{},

		enablePolicy: enablePolicy,
	}
	if e.enablePolicy == "" {
		e.enablePolicy = EnablePolicyDefault
	}
	return e
}

// writeDNSRulesTo makes the engine write the `dns-rules` table too, and
// initialize it with the others. Call it before run.
func (e *selectorEngine) writeDNSRulesTo(table statedb.RWTable[*policy.DNSRules]) {
	txn := e.db.WriteTxn(table)
	markDNSRules := table.RegisterInitializer(txn, "policy-selectors")
	txn.Commit()
	e.dnsRules = table
	markOthers := e.markInitialized
	e.markInitialized = func(txn statedb.WriteTxn) {
		markOthers(txn)
		markDNSRules(txn)
	}
}

// run processes changes as they come.
func (e *selectorEngine) run(ctx context.Context, health cell.Health) error {
	// Closed when the job ends, not left to a runtime cleanup (which
	// fires outside a synctest bubble that ran the hive).
	defer func() {
		for _, changes := range []interface{ Close() }{e.policyChanges, e.identityChanges} {
			if changes != nil {
				changes.Close()
			}
		}
		if e.endpointChanges != nil {
			e.endpointChanges.Close()
		}
	}()
	for {
		watch, err := e.round()
		if err != nil {
			return err
		}
		e.reportHealth(health)
		if _, err := watch.Wait(ctx, 0); err != nil {
			return nil // stopping
		}
	}
}

// round processes the changes of the policies and identities tables up to
// one snapshot, writes the entries of the identities they affect, and
// initializes the tables when it may. It returns what to wait on for the
// next round.
func (e *selectorEngine) round() (*statedb.WatchSet, error) {
	if e.policyChanges == nil {
		txn := e.db.WriteTxn(e.policies, e.identities)
		var err error
		if e.policyChanges, err = e.policies.Changes(txn); err == nil {
			e.identityChanges, err = e.identities.Changes(txn)
		}
		// The first changes are the objects in txn: they stand for every
		// change up to it, deletions included.
		e.seen.policies, e.seen.identities = e.policies.Revision(txn), e.identities.Revision(txn)
		txn.Commit()
		if err != nil {
			return nil, fmt.Errorf("observe policies and identities: %w", err)
		}
		if e.endpoints != nil {
			txn := e.db.WriteTxn(e.endpoints)
			e.endpointChanges, err = e.endpoints.Changes(txn)
			e.seen.endpoints = e.endpoints.Revision(txn)
			txn.Commit()
			if err != nil {
				return nil, fmt.Errorf("observe endpoints: %w", err)
			}
		}
	}

	snapshot := e.db.ReadTxn()
	policyChanges, policyWatch := e.policyChanges.Next(snapshot)
	identityChanges, identityWatch := e.identityChanges.Next(snapshot)
	var changed []statedb.Change[*policy.Policy]
	for change := range policyChanges {
		changed = append(changed, change)
		e.seen.policies = max(e.seen.policies, change.Revision)
	}
	// The policies a round adds (a directory's first read: ten files of
	// a hundred thousand CIDRs) may have as many CIDRs together as there
	// are identities, while none has on its own: one pass over the
	// identities then marks them all (see indexPolicy).
	var scanned map[string]struct{}
	added := addedCIDRs(changed)
	if added >= scanMinCIDRs && added*scanRatio >= e.identities.NumObjects(snapshot) {
		scanned = map[string]struct{}{}
	}
	// Room for all of them at once, not policy by policy (indexPolicy):
	// ten files of a hundred thousand grew the index nine times.
	e.index.reserve(added)
	for _, change := range changed {
		e.policyChanged(snapshot, change.Object, change.Deleted, scanned)
	}
	if len(scanned) > 0 {
		e.markIndexedWithin(snapshot, scanned)
	}
	var endpointsWatch <-chan struct{}
	if e.endpointChanges != nil {
		var endpointChanges iter.Seq2[statedb.Change[*endpoint.State], statedb.Revision]
		endpointChanges, endpointsWatch = e.endpointChanges.Next(snapshot)
		for change := range endpointChanges {
			e.endpointChanged(snapshot, change.Object, change.Deleted)
			e.seen.endpoints = max(e.seen.endpoints, change.Revision)
		}
	}
	// With no rule in force and no entry written, an identity that
	// changed has no entry to recompute: a rule added later marks the
	// identities it selects itself (markWithin). The changes are still
	// read, to move past them.
	idle := e.idle(snapshot)
	for change := range identityChanges {
		e.seen.identities = max(e.seen.identities, change.Revision)
		id := change.Object.ID
		if change.Deleted {
			e.peers.set(id, nil)
		} else {
			e.peers.set(id, peerLabelsOf(change.Object.Labels))
		}
		if id != identity.World && !idle {
			e.dirty[id] = struct{}{}
		}
	}

	watch := statedb.NewWatchSet()
	watch.Add(policyWatch, identityWatch)
	if endpointsWatch != nil {
		watch.Add(endpointsWatch)
	}
	initializing := false
	if e.markInitialized != nil {
		// The directory was read and applied, the ipcache resolved every
		// producer's prefixes into identities, and all of it up to this
		// snapshot is processed: once written, the tables are complete.
		policiesDone, policiesWatch := e.policies.Initialized(snapshot)
		ipcacheDone, ipcacheWatch := e.ipcache.Initialized(snapshot)
		initializing = policiesDone && ipcacheDone
		// Only what is still to come: the channel of a table already
		// initialized is closed, and waiting on it would spin.
		if !policiesDone {
			watch.Add(policiesWatch)
		}
		if !ipcacheDone {
			watch.Add(ipcacheWatch)
		}
		// After a restart, the endpoints in force are what keeps their
		// subjects' entries: the tables are complete only with them.
		if e.endpoints != nil {
			endpointsDone, endpointsInitWatch := e.endpoints.Initialized(snapshot)
			initializing = initializing && endpointsDone
			if !endpointsDone {
				watch.Add(endpointsInitWatch)
			}
		}
	}
	if err := e.write(initializing); err != nil {
		return nil, err
	}
	if len(e.notComputed) > 0 && e.entries.NumObjects(e.db.ReadTxn()) < e.maxEntries {
		// The round made room: what did not fit before is tried in the
		// next round, at once. That round fills the room or computes them
		// all, so this does not repeat without a change.
		for id := range e.notComputed {
			e.dirty[id] = struct{}{}
		}
		now := make(chan struct{})
		close(now)
		watch.Add(now)
	}
	written := e.db.ReadTxn()
	e.progress.computed.Set(policy.Computed{
		Policies: e.seen.policies, Identities: e.seen.identities, Endpoints: e.seen.endpoints,
		Entries: e.entries.Revision(written), Enforcement: e.enforcement.Revision(written),
		Selectors: len(e.index.byCIDR) + len(e.peerIndex.groups),
	})
	if initializing {
		e.markInitialized = nil
		e.log.Info("Policy tables initialized", "entries", e.entries.NumObjects(e.db.ReadTxn()),
			"enable-policy", e.enablePolicy)
	}
	return watch, nil
}

// policyChanged re-indexes a policy's selectors and marks the identities
// inside its old and new CIDRs dirty. With scanned, those inside its new
// CIDRs are left for the caller to mark by one pass over the identities,
// for all the policies scanned holds once it returns (markIndexedWithin).
func (e *selectorEngine) policyChanged(txn statedb.ReadTxn, p *policy.Policy, deleted bool, scanned map[string]struct{}) {
	old := e.indexed[p.Name]
	if !deleted && old != nil && old.SameRules(p) {
		e.indexed[p.Name] = p
		return
	}
	if old != nil {
		e.unindexPolicy(txn, old)
	}
	if deleted {
		delete(e.indexed, p.Name)
		return
	}
	e.indexed[p.Name] = p
	e.indexPolicy(txn, p, 1, scanned)
}

func (e *selectorEngine) unindexPolicy(txn statedb.ReadTxn, p *policy.Policy) {
	e.indexPolicy(txn, p, -1, nil)
}

// addedCIDRs counts the CIDR peers of the policies changes add or change.
func addedCIDRs(changes []statedb.Change[*policy.Policy]) int {
	n := 0
	for _, change := range changes {
		if !change.Deleted {
			n += cidrPeers(change.Object)
		}
	}
	return n
}

// indexPolicy adds (by 1) or removes (by -1) the selectors, subjects and
// counts of a policy, and marks the identities they select dirty; those
// of an added policy are left to the caller when scanned is not nil, which
// gets the policy's name (see policyChanged).
func (e *selectorEngine) indexPolicy(txn statedb.ReadTxn, p *policy.Policy, by int, scanned map[string]struct{}) {
	if by > 0 {
		subjects := map[identity.Number]struct{}{}
		if p.Selector.Empty() {
			subjects[0] = struct{}{}
		}
		for id, s := range e.subjects {
			if p.Selector.Matches(s.labels) {
				subjects[id] = struct{}{}
			}
		}
		e.selected[p.Name] = subjects
	}
	counts := countsOf(p)
	for id := range e.selected[p.Name] {
		e.countsOfSubject(id).add(counts, by)
	}
	if hasDNSRules(p) {
		for id := range e.selected[p.Name] {
			e.dnsDirty[id] = struct{}{}
		}
		if by > 0 {
			e.dnsPolicies[p.Name] = p
		} else {
			delete(e.dnsPolicies, p.Name)
		}
	}
	cidrs := cidrPeers(p)
	// With about as many CIDRs as identities, one pass over the
	// identities, each looked up in the index, costs less than a search of
	// the identities table per CIDR (markWithin). The pass finds the
	// policy's CIDRs in the index: before they are removed, after they are
	// added.
	scan := cidrs >= scanMinCIDRs && cidrs*scanRatio >= e.identities.NumObjects(txn)
	if by > 0 && scanned != nil {
		scan = true
		scanned[p.Name] = struct{}{}
	}
	if by < 0 {
		delete(e.selected, p.Name)
		if scan {
			e.markIndexedWithin(txn, map[string]struct{}{p.Name: {}})
		}
	}
	for _, dir := range policy.Directions() {
		rules := p.Rules(dir)
		for i := range rules {
			rule := &rules[i]
			if rule.AnyPeer {
				e.dirty[0] = struct{}{}
				if by > 0 {
					e.index.add(newSelector(p, dir, rule, nil))
				}
			}
			if by > 0 && hasRulePeers(rule) {
				for _, g := range e.peerIndex.add(newSelector(p, dir, rule, nil), rule) {
					e.markPeers(g)
				}
			}
			if by > 0 {
				e.index.addPeers(p, dir, rule)
			}
			for j := range rule.Peers {
				peer := &rule.Peers[j]
				if by < 0 {
					e.index.removeCIDR(p.Name, peer.CIDR)
				}
				switch {
				case !scan:
					e.markWithin(txn, peer.CIDR)
				case peer.CIDR.Bits() == 0:
					e.dirty[identity.World] = struct{}{} // as markWithin does
				}
			}
		}
	}
	if by > 0 && scan && scanned == nil {
		e.markIndexedWithin(txn, map[string]struct{}{p.Name: {}})
	}
	if by < 0 {
		e.index.removeAnyPeer(p.Name)
		for _, g := range e.peerIndex.remove(p.Name) {
			e.markPeers(g)
		}
	}
}

// markPeers marks dirty the identities a peer selector selects.
func (e *selectorEngine) markPeers(g *peerGroup) {
	for id, pl := range e.peers.selectable(g) {
		if g.selects(id, pl) {
			e.dirty[id] = struct{}{}
		}
	}
	if g.endpoints == nil && g.fqdn == "" {
		for _, id := range reservedPeers() {
			if g.selects(id, nil) {
				e.dirty[id] = struct{}{}
			}
		}
	}
}

// enforcementCounts counts, for one subject and direction, the policies
// that make the direction enforced (rules not enableDefaultDeny false) and
// those with deny rules in it.
type enforcementCounts struct {
	defaultDeny, deny [2]int
}

// countsOf returns what a policy adds to the counts of each subject it
// applies to: 1 where it makes a direction enforced or has deny rules.
func countsOf(p *policy.Policy) enforcementCounts {
	var c enforcementCounts
	for _, dir := range policy.Directions() {
		for _, rule := range p.Rules(dir) {
			if !rule.NoDefaultDeny {
				c.defaultDeny[dir] = 1
			}
			if rule.Deny {
				c.deny[dir] = 1
			}
		}
	}
	return c
}

func (c *enforcementCounts) add(other enforcementCounts, by int) {
	for _, dir := range policy.Directions() {
		c.defaultDeny[dir] += by * other.defaultDeny[dir]
		c.deny[dir] += by * other.deny[dir]
	}
}

// countsOfSubject returns the counts of a subject, made on first use.
func (e *selectorEngine) countsOfSubject(id identity.Number) *enforcementCounts {
	c, ok := e.counts[id]
	if !ok {
		c = &enforcementCounts{}
		e.counts[id] = c
	}
	return c
}

// subject is a local endpoint identity: the labels its policies are
// selected by (endpoint.KeyValues of its identity labels), and how many
// local endpoints have it.
type subject struct {
	labels    map[string]string
	endpoints int
}

// endpointChanged follows a local endpoint's identity: an endpoint that
// appears takes its identity as a subject, one that goes or changes
// identity releases its old one. Rows of other nodes' endpoints, and of
// endpoints without an identity yet, are no subject.
func (e *selectorEngine) endpointChanged(txn statedb.ReadTxn, ep *endpoint.State, deleted bool) {
	name := ep.ID()
	old, had := e.endpointIdentity[name]
	id := ep.Identity
	if deleted || !ep.Local || id == identity.Unknown {
		if had {
			delete(e.endpointIdentity, name)
			e.releaseSubject(txn, old)
		}
		return
	}
	if had && old == id {
		return
	}
	e.endpointIdentity[name] = id
	e.takeSubject(txn, id, ep)
	if had {
		e.releaseSubject(txn, old)
	}
}

// takeSubject counts one more endpoint of identity id; for the first, it
// applies the policies whose selectors match the identity's labels.
func (e *selectorEngine) takeSubject(txn statedb.ReadTxn, id identity.Number, ep *endpoint.State) {
	if s, ok := e.subjects[id]; ok {
		s.endpoints++
		return
	}
	s := &subject{labels: endpoint.KeyValues(ep.IdentityLabels), endpoints: 1}
	e.subjects[id] = s
	delete(e.goneSubjects, id)
	e.dnsDirty[id] = struct{}{}
	counts := e.countsOfSubject(id)
	for name, p := range e.indexed {
		if !p.Selector.Matches(s.labels) {
			continue
		}
		e.selected[name][id] = struct{}{}
		counts.add(countsOf(p), 1)
		e.markSelected(txn, p)
	}
}

// releaseSubject counts one endpoint of identity id less; with the last,
// the identity is no subject: its policies' identities are recomputed
// without it, and its enforcement rows go.
func (e *selectorEngine) releaseSubject(txn statedb.ReadTxn, id identity.Number) {
	s, ok := e.subjects[id]
	if !ok {
		return
	}
	if s.endpoints--; s.endpoints > 0 {
		return
	}
	delete(e.subjects, id)
	delete(e.counts, id)
	e.goneSubjects[id] = struct{}{}
	e.dnsDirty[id] = struct{}{}
	for name, subjects := range e.selected {
		if _, ok := subjects[id]; !ok {
			continue
		}
		delete(subjects, id)
		e.markSelected(txn, e.indexed[name])
	}
}

// markSelected marks dirty the identities whose entries a policy gives:
// those inside its CIDRs, those its peers by label, entity and DNS name select, and
// identity 0 for its rules for every peer.
func (e *selectorEngine) markSelected(txn statedb.ReadTxn, p *policy.Policy) {
	for _, dir := range policy.Directions() {
		for _, rule := range p.Rules(dir) {
			if rule.AnyPeer {
				e.dirty[0] = struct{}{}
			}
			if hasRulePeers(&rule) {
				for _, g := range rulePeers(&rule) {
					e.markPeers(g)
				}
			}
			for _, peer := range rule.Peers {
				e.markWithin(txn, peer.CIDR)
			}
		}
	}
}

// subjectIDs returns the subjects in order: 0, then the local endpoint
// identities.
func (e *selectorEngine) subjectIDs() []identity.Number {
	return append([]identity.Number{0}, slices.Sorted(maps.Keys(e.subjects))...)
}

func newSelector(p *policy.Policy, dir policy.Direction, rule *policy.Rule, peer *policy.CIDRSelector) *selector {
	return &selector{ruleSelector: newRuleSelector(p, dir, rule), peer: peer}
}

// family indexes lengths.
func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 0
	}
	return 1
}

// prefixesOf returns the cidr prefixes of an identity, valid until the
// next call.
func (e *selectorEngine) prefixesOf(txn statedb.ReadTxn, id identity.Number) []netip.Prefix {
	if id == identity.World {
		return policy.WorldPrefixes()
	}
	ident, _, found := e.identities.Get(txn, identitycell.IdentityIndex.Query(id))
	if !found {
		return nil
	}
	// A prefix's own identity's (most of them) fills the engine's buffer;
	// the caller keeps the slice no longer than its own use.
	return ident.Labels.AppendPrefixes(e.onePrefix[:0])
}

// A policy's identities are marked by a pass over all identities
// (markIndexedWithin) when it has at least scanMinCIDRs CIDRs and one
// scanRatio-th as many as there are identities, or the policies a round
// adds have that many together (one pass for all of them).
const (
	scanMinCIDRs = 1024
	scanRatio    = 4
)

// markIndexedWithin marks dirty the identities with a cidr prefix inside
// one of the policies' CIDRs in the index: the selectors the index finds
// for the identity's prefixes (those whose CIDR holds one) include one of
// the policies'.
func (e *selectorEngine) markIndexedWithin(txn statedb.ReadTxn, policies map[string]struct{}) {
	e.passes++
	var one [1]netip.Prefix
	for ident := range e.identities.All(txn) {
		for s := range e.index.candidates(ident.Labels.AppendPrefixes(one[:0])) {
			if _, ok := policies[s.policy]; ok {
				e.dirty[ident.ID] = struct{}{}
				break
			}
		}
	}
}

// markWithin marks dirty the identities with a cidr prefix inside cidr.
func (e *selectorEngine) markWithin(txn statedb.ReadTxn, cidr netip.Prefix) {
	if cidr.Bits() == 0 {
		e.dirty[identity.World] = struct{}{}
	}
	for ident := range identitycell.IdentitiesWithin(txn, e.identities, cidr) {
		e.dirty[ident.ID] = struct{}{}
	}
}

// write recomputes the entries of the dirty identities and the
// enforcement rows, and writes what changed. initializing marks the tables
// initialized, in the transaction of the last entries.
//
// Enforcement is written only from initialization on: until then the
// datapath keeps the enforcement it has (after a restart, the previous
// run's), rather than switching it off before the policies are known. A
// direction that stops being enforced is written in the first transaction,
// before the entries it no longer needs go; one that starts being enforced
// in the last, after the entries it needs: the datapath applies them in
// that order (make before break: datapathcell/README.md).
func (e *selectorEngine) write(initializing bool) error {
	// A fresh set each round: iterating or clearing a map costs its
	// capacity, which the first round makes as large as all identities.
	var dirty []identity.Number
	if !e.idle(e.db.ReadTxn()) {
		dirty = slices.Sorted(maps.Keys(e.dirty))
	}
	e.dirty = map[identity.Number]struct{}{}
	writeEnforcement := initializing || e.markInitialized == nil
	if len(dirty) == 0 && len(e.dnsDirty) == 0 && !initializing && (!writeEnforcement || !e.enforcementChanged(e.db.ReadTxn())) {
		return nil // nothing changed that the entries depend on
	}
	tables := []statedb.TableMeta{e.entries, e.enforcement}
	if e.dnsRules != nil {
		tables = append(tables, e.dnsRules)
	}
	var (
		scratch []grant
		names   = entryNames{}
		// current are the entries in the table of the chunk's identities,
		// those of chunk[i] up to ends[i].
		current []*policy.Entry
		ends    []int
	)
	for start := 0; start < len(dirty) || start == 0; start += writeChunkSize {
		txn := e.db.WriteTxn(tables...)
		if start == 0 && writeEnforcement {
			if err := e.writeEnforcement(txn, false); err != nil {
				txn.Abort()
				return err
			}
		}
		if start == 0 {
			if err := e.writeDNSRules(txn, false); err != nil {
				txn.Abort()
				return err
			}
		}
		chunk := dirty[start:min(start+writeChunkSize, len(dirty))]
		// The chunk's entries are all read before any is written: a read
		// of a table in a write transaction freezes the tree's nodes the
		// transaction copied so far (statedb's part.Txn), so a read
		// between writes makes the next write copy its whole path again.
		current, ends = policy.AppendIdentitiesEntries(txn, e.entries, chunk, current[:0], ends[:0])
		from := 0
		for i, id := range chunk {
			e.recomputed++
			scratch = e.grants(txn, id, scratch[:0])
			if err := e.writeIdentity(txn, id, current[from:ends[i]], resolve(scratch, names)); err != nil {
				txn.Abort()
				return err
			}
			from = ends[i]
		}
		clear(current) // not kept alive until the next chunk
		if start+writeChunkSize >= len(dirty) {
			if err := e.writeDNSRules(txn, true); err != nil {
				txn.Abort()
				return err
			}
		}
		if start+writeChunkSize >= len(dirty) && writeEnforcement {
			if err := e.writeEnforcement(txn, true); err != nil {
				txn.Abort()
				return err
			}
			if initializing {
				e.markInitialized(txn)
			}
		}
		txn.Commit()
	}
	return nil
}

// hasDNSRules reports whether a policy has DNS rules in egress, the only
// direction where they intercept.
func hasDNSRules(p *policy.Policy) bool {
	for _, rule := range p.Egress {
		if rule.FQDN != nil && len(rule.FQDN.DNS) > 0 && !rule.Deny {
			return true
		}
	}
	return false
}

// desiredDNSRules returns the `dns-rules` row of a subject: the names of
// the DNS rules of the policies that apply to it, nil if none has any.
func (e *selectorEngine) desiredDNSRules(subject identity.Number) *policy.DNSRules {
	var (
		names    []fqdn.Selector
		policies []string
	)
	for name, p := range e.dnsPolicies {
		if _, ok := e.selected[name][subject]; !ok {
			continue
		}
		policies = append(policies, name)
		for _, rule := range p.Egress {
			if rule.FQDN == nil || rule.Deny {
				continue
			}
			for _, dns := range rule.FQDN.DNS {
				names = append(names, dns.Names...)
			}
		}
	}
	if len(policies) == 0 {
		return nil
	}
	slices.Sort(policies)
	return &policy.DNSRules{Subject: subject, Names: policy.CanonicalDNSNames(names), Policies: policies}
}

// writeDNSRules writes the rows of the subjects whose DNS rules may have
// changed: with stricter false those that allow more names than before
// (a new row, or one whose names include all the old ones), else the
// others (fewer names, or none: the row goes), as writeEnforcement
// orders its rows. The first transaction of a write passes false, the
// last true: the proxy knows a name before the dns-proxy entries that
// steer its queries there are written, and forgets one only after the
// entries that no longer need it went.
func (e *selectorEngine) writeDNSRules(txn statedb.WriteTxn, stricter bool) error {
	if e.dnsRules == nil {
		clear(e.dnsDirty)
		return nil
	}
	for subject := range e.dnsDirty {
		want := e.desiredDNSRules(subject)
		have, _, found := e.dnsRules.Get(txn, policy.DNSRulesIndex.Query(subject))
		switch {
		case want == nil && !found, want != nil && found && have.Same(want):
			continue
		case want == nil:
			if stricter {
				if _, _, err := e.dnsRules.Delete(txn, have); err != nil {
					return fmt.Errorf("delete the DNS rules of %d: %w", subject, err)
				}
			}
			continue
		}
		looser := !found || !slices.ContainsFunc(have.Names, func(n fqdn.Selector) bool { return !slices.Contains(want.Names, n) })
		if looser == stricter {
			continue
		}
		if _, _, err := e.dnsRules.Insert(txn, want); err != nil {
			return fmt.Errorf("write the DNS rules of %d: %w", subject, err)
		}
	}
	if stricter {
		clear(e.dnsDirty)
	}
	return nil
}

// idle reports whether no rule selects anything and the `policy` table is
// empty: every identity's desired entries are then none, as are its
// current ones, and there is nothing to recompute. The engine is the
// table's only writer of rows, so txn sees all it wrote.
func (e *selectorEngine) idle(txn statedb.ReadTxn) bool {
	return e.index.empty() && e.peerIndex.empty() && e.entries.NumObjects(txn) == 0
}

// grant is one rule of a policy giving one key a verdict.
type grant struct {
	key     policy.Key
	verdict policy.Verdict
	policy  string
	rule    string
}

// grants appends what the rules in force say of an identity's keys:
// those of the rules whose selectors select it, or for identity 0 those
// of the rules for every peer.
func (e *selectorEngine) grants(txn statedb.ReadTxn, id identity.Number, out []grant) []grant {
	if id == 0 {
		for _, s := range e.index.anyPeer {
			e.visited++
			for subject := range e.selected[s.policy] {
				out = s.appendGrants(out, subject, id)
			}
		}
		return out
	}
	prefixes := e.prefixesOf(txn, id)
	for s := range e.index.candidates(prefixes) {
		e.visited++
		if s.peer.Excludes(prefixes) {
			continue
		}
		for subject := range e.selected[s.policy] {
			out = s.appendGrants(out, subject, id)
		}
	}
	if pl := e.peers.all[id]; pl != nil || isReservedPeer(id) {
		for g := range e.peerIndex.candidates(pl) {
			e.visited++
			if !g.selects(id, pl) {
				continue
			}
			for _, s := range g.selectors {
				for subject := range e.selected[s.policy] {
					out = s.appendGrants(out, subject, id)
				}
			}
		}
	}
	return out
}

// appendGrants appends the selector's keys for identity id in subject's
// policy: any protocol without ports, else each port range's blocks. The
// ports of an egress rule's DNS rules are dns-proxy: their DNS goes
// through the proxy.
func (s *selector) appendGrants(out []grant, subject, id identity.Number) []grant {
	verdict := policy.VerdictAllow
	if s.deny {
		verdict = policy.VerdictDeny
	}
	base := policy.Key{Subject: subject, Identity: id, Direction: s.direction}
	if len(s.ports) == 0 {
		return append(out, grant{base, verdict, s.policy, s.rule})
	}
	var keys [8]policy.Key
	for _, pr := range s.ports {
		v := verdict
		if s.intercepts(pr) {
			v = policy.VerdictDNSProxy
		}
		for _, key := range pr.AppendKeys(keys[:0], base) {
			out = append(out, grant{key, v, s.policy, s.rule})
		}
	}
	return out
}

// intercepts reports whether the selector's rule has DNS rules on pr, in
// an egress allow rule: only there do DNS rules steer the endpoint's DNS
// to the proxy (the formats take them nowhere else). Most rules have no
// FQDN part: one nil test.
func (s *selector) intercepts(pr policy.PortRange) bool {
	if s.source == nil || s.source.FQDN == nil || s.deny || s.direction != policy.Egress {
		return false
	}
	for _, dns := range s.source.FQDN.DNS {
		if slices.Contains(dns.Ports, pr) {
			return true
		}
	}
	return false
}

// verdictRank orders the verdicts one key may get from several rules:
// deny wins over everything, dns-proxy over allow.
func verdictRank(v policy.Verdict) int {
	switch v {
	case policy.VerdictDeny:
		return 2
	case policy.VerdictDNSProxy:
		return 1
	}
	return 0
}

// entryNames shares the Policies and Rules of the entries one rule alone
// gives (most of them: a rule of a hundred thousand CIDRs gives as many
// entries, with the same two names), by policy and rule. Both slices are
// capped, so that the entries' immutable names stay theirs. One per round
// of the engine: what it holds goes with it.
type entryNames map[[2]string][]string

// of returns the Policies and Rules of an entry of the rule alone.
func (n entryNames) of(pol, rule string) (policies, rules []string) {
	names, ok := n[[2]string{pol, rule}]
	if !ok {
		names = []string{pol, rule}
		n[[2]string{pol, rule}] = names
	}
	return names[0:1:1], names[1:2:2]
}

// resolve turns an identity's grants into its entries, in key order, as
// Cilium resolves deny against allow: deny wins whatever the allow's port
// specificity. A key both allowed and denied is a deny entry (of the deny
// rules alone); an allow whose key lies inside a deny entry's prefix is
// not written, since the program's longest-prefix lookup would find it
// rather than the deny. An allow wider than a deny stays: the lookup
// finds the narrower deny for what the deny covers. (Across identity 0
// and the remote identity, the program's two lookups resolve it.) A
// dns-proxy is an allow that wins over a plain allow of the same key (of
// the dns-proxy rules alone): what a DNS rule intercepts is intercepted
// whatever else allows it. shared, if not nil, gives the names of the
// entries of one rule alone.
func resolve(grants []grant, shared entryNames) []*policy.Entry {
	slices.SortFunc(grants, func(a, b grant) int {
		if c := policy.CompareKeys(a.key, b.key); c != 0 {
			return c
		}
		if a.verdict != b.verdict {
			return -cmp.Compare(verdictRank(a.verdict), verdictRank(b.verdict)) // deny, then dns-proxy, first
		}
		if c := strings.Compare(a.policy, b.policy); c != 0 {
			return c
		}
		return strings.Compare(a.rule, b.rule)
	})
	grants = slices.Compact(grants)
	var entries []*policy.Entry
	var denies []policy.Key
	for i := 0; i < len(grants); {
		j := i + 1
		for j < len(grants) && grants[j].key == grants[i].key {
			j++
		}
		entry := &policy.Entry{Key: grants[i].key, Verdict: grants[i].verdict}
		if j-i == 1 && shared != nil {
			// One rule's alone, as most are: the names are those of the
			// rule's other entries.
			entry.Policies, entry.Rules = shared.of(grants[i].policy, grants[i].rule)
		} else {
			// The entry's policies and rules share one allocation, each
			// capped to its half: most entries have one of each.
			names := make([]string, 2*(j-i))
			entry.Policies, entry.Rules = names[:0:j-i], names[j-i:j-i:2*(j-i)]
			for _, g := range grants[i:j] {
				if g.verdict != entry.Verdict {
					break // the allows of a denied (or intercepted) key
				}
				if len(entry.Policies) == 0 || entry.Policies[len(entry.Policies)-1] != g.policy {
					entry.Policies = append(entry.Policies, g.policy)
				}
				entry.Rules = append(entry.Rules, g.rule)
			}
		}
		i = j
		entries = append(entries, entry)
		if entry.Verdict == policy.VerdictDeny {
			denies = append(denies, entry.Key)
		}
	}
	if len(denies) == 0 {
		return entries
	}
	return slices.DeleteFunc(entries, func(entry *policy.Entry) bool {
		return entry.Verdict != policy.VerdictDeny && slices.ContainsFunc(denies, func(deny policy.Key) bool {
			return deny.Matches(entry.Key)
		})
	})
}

// writeIdentity makes the identity's entries the desired ones: changed
// and new entries are written (pending reconciliation), entries no longer
// desired are deleted, and unchanged ones are left alone. current are
// the identity's entries in the table, in key order. New keys are
// added only while the table has fewer rows than maxEntries, denies
// first (a missing allow drops traffic, a missing deny would let it
// through); the identity is in notComputed while some are left out.
func (e *selectorEngine) writeIdentity(txn statedb.WriteTxn, id identity.Number, current, desired []*policy.Entry) error {
	// Both are in key order: the index orders keys as policy.CompareKeys.
	var added []*policy.Entry
	for _, want := range desired {
		for len(current) > 0 && policy.CompareKeys(current[0].Key, want.Key) < 0 {
			if err := e.deleteEntry(txn, current[0]); err != nil {
				return err
			}
			current = current[1:]
		}
		if len(current) == 0 || current[0].Key != want.Key {
			added = append(added, want)
			continue
		}
		have := current[0]
		current = current[1:]
		if have.Same(want) {
			continue
		}
		if err := e.insertEntry(txn, want); err != nil {
			return err
		}
	}
	for _, stale := range current {
		if err := e.deleteEntry(txn, stale); err != nil {
			return err
		}
	}
	slices.SortStableFunc(added, func(a, b *policy.Entry) int { return -cmp.Compare(verdictRank(a.Verdict), verdictRank(b.Verdict)) })
	room := e.maxEntries - e.entries.NumObjects(txn)
	for i, want := range added {
		if i >= room {
			e.notComputed[id] = len(added) - i
			return nil
		}
		if err := e.insertEntry(txn, want); err != nil {
			return err
		}
	}
	delete(e.notComputed, id)
	return nil
}

func (e *selectorEngine) insertEntry(txn statedb.WriteTxn, want *policy.Entry) error {
	want.Status = reconciler.StatusPending()
	if _, _, err := e.entries.Insert(txn, want); err != nil {
		return fmt.Errorf("write policy entry %s: %w", want.Key, err)
	}
	return nil
}

func (e *selectorEngine) deleteEntry(txn statedb.WriteTxn, entry *policy.Entry) error {
	if _, _, err := e.entries.Delete(txn, entry); err != nil {
		return fmt.Errorf("delete policy entry %s: %w", entry.Key, err)
	}
	return nil
}

// The values of --enable-policy (Cilium's).
const (
	// EnablePolicyDefault enforces a direction as the policies in force
	// say (docs/CONTRACT.md, "Policy semantics").
	EnablePolicyDefault = "default"
	// EnablePolicyAlways enforces both directions with default deny, with
	// or without policies.
	EnablePolicyAlways = "always"
	// EnablePolicyNever enforces nothing: every packet passes; the
	// `policy` table and the policy map are still kept.
	EnablePolicyNever = "never"
)

// desiredEnforcement is the row the policies that apply to a subject and
// --enable-policy give its direction.
func (e *selectorEngine) desiredEnforcement(subject identity.Number, dir policy.Direction) policy.Enforcement {
	var counts enforcementCounts
	if c, ok := e.counts[subject]; ok {
		counts = *c
	}
	row := policy.Enforcement{Subject: subject, Direction: dir, HasDeny: counts.deny[dir] > 0}
	switch e.enablePolicy {
	case EnablePolicyAlways:
		row.Enforced = true
	case EnablePolicyNever:
		row.HasDeny = false
	default:
		row.Enforced = counts.defaultDeny[dir] > 0
	}
	return row
}

// writeEnforcement writes the rows that differ from the desired ones, of
// every subject: with stricter false those that let more through than the
// row they replace, else the others. The first transaction of a write
// passes false, the last true: a direction is loosened before the entries
// it no longer needs go, and tightened after the entries it needs are in.
// A new subject's rows come in the last, after its entries; a subject
// that went loses its rows in the last, after its entries went.
func (e *selectorEngine) writeEnforcement(txn statedb.WriteTxn, stricter bool) error {
	for _, subject := range e.subjectIDs() {
		for _, dir := range policy.Directions() {
			want := e.desiredEnforcement(subject, dir)
			have, _, found := e.enforcement.Get(txn, policy.EnforcementIndex.Query(want.Key()))
			if found && have.Enforced == want.Enforced && have.HasDeny == want.HasDeny {
				continue
			}
			looser := found && want.Strictness() < have.Strictness()
			if looser == stricter {
				continue
			}
			want.Status = reconciler.StatusPending()
			if _, _, err := e.enforcement.Insert(txn, &want); err != nil {
				return fmt.Errorf("write %s enforcement of %d: %w", dir, subject, err)
			}
		}
	}
	if !stricter {
		return nil
	}
	for subject := range e.goneSubjects {
		for _, dir := range policy.Directions() {
			have, _, found := e.enforcement.Get(txn, policy.EnforcementIndex.Query(policy.EnforcementKey{Subject: subject, Direction: dir}))
			if !found {
				continue
			}
			if _, _, err := e.enforcement.Delete(txn, have); err != nil {
				return fmt.Errorf("delete %s enforcement of %d: %w", dir, subject, err)
			}
		}
	}
	clear(e.goneSubjects)
	return nil
}

// enforcementChanged reports whether a subject's row is missing or
// differs from the desired one, or a subject that went has rows.
func (e *selectorEngine) enforcementChanged(txn statedb.ReadTxn) bool {
	if len(e.goneSubjects) > 0 {
		return true
	}
	for _, subject := range e.subjectIDs() {
		for _, dir := range policy.Directions() {
			want := e.desiredEnforcement(subject, dir)
			row, _, found := e.enforcement.Get(txn, policy.EnforcementIndex.Query(want.Key()))
			if !found || row.Enforced != want.Enforced || row.HasDeny != want.HasDeny {
				return true
			}
		}
	}
	return false
}

func (e *selectorEngine) reportHealth(health cell.Health) {
	txn := e.db.ReadTxn()
	var enforced, denyOnly []string
	for _, dir := range policy.Directions() {
		switch row := e.desiredEnforcement(0, dir); {
		case row.Enforced:
			enforced = append(enforced, dir.String())
		case row.HasDeny:
			denyOnly = append(denyOnly, dir.String())
		}
	}
	list := func(dirs []string) string {
		if len(dirs) == 0 {
			return "none"
		}
		return strings.Join(dirs, ", ")
	}
	status := fmt.Sprintf("%d policy entries from %d policies; --enable-policy=%s; enforced (default deny): %s; deny rules only: %s",
		e.entries.NumObjects(txn), len(e.indexed), e.enablePolicy, list(enforced), list(denyOnly))
	if len(e.notComputed) == 0 {
		health.OK(status)
		return
	}
	missing := 0
	for _, n := range e.notComputed {
		missing += n
	}
	health.Degraded(status, fmt.Errorf("%d policy entries of %d identities not computed: %w (%d entries, %d times --policy-map-max-entries %d): "+
		"the policies in force select more than the policy map holds, and their traffic is dropped; raise --policy-map-max-entries or remove policies",
		missing, len(e.notComputed), ErrPolicyTableFull, e.maxEntries, entryBound, e.maxEntries/entryBound))
}
