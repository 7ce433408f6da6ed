// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// DefaultPolicyMapMaxEntries is the datapath's default
// --policy-map-max-entries (cells' tests check that they agree): the
// limit of a hive without a datapath, and of `policy validate`.
const DefaultPolicyMapMaxEntries = 16384

// countBeyond is how far past the limit a file's entries are counted
// exactly, as a multiple of the limit: far enough to say how much a file
// is over, without a pathological file costing the time its full
// expansion would.
const countBeyond = 64

// EntryCount is the number of policy-map entries a file's policies
// compute for the identities of their own prefixes (CountEntries).
type EntryCount struct {
	// Entries is the count; when not Exact, the count stopped there and
	// the file computes more.
	Entries int
	Exact   bool
}

// String returns the count, "more than N" when it is not exact.
func (c EntryCount) String() string {
	if c.Exact {
		return fmt.Sprintf("%d", c.Entries)
	}
	return fmt.Sprintf("more than %d", c.Entries)
}

// CountEntries counts the policy-map entries that a file's policies
// compute on their own, and checks them against the policy map's size
// (limit, --policy-map-max-entries): the entries of each identity of
// their prefixes (the CIDRs and except prefixes, each its own identity
// with its cidr label), of world when a CIDR is all addresses, and of
// identity 0 for rules for every peer, as the selector engine computes
// them (a port range as its aligned blocks, a deny hiding the allows
// inside it). Other owners' narrower prefixes and other files' rules can
// only add to it in the agent.
//
// The count expands nothing at full size: identity by identity, it keeps
// at most limit+1 distinct keys of one identity, and stops counting at
// countBeyond times the limit (the count is then not Exact). So checking
// a file of 1,000 CIDRs times 40 port ranges costs no memory in
// proportion to the 862,000 entries it would compute.
//
// Possible errors: *policyfile.FileError wrapping
// policyfile.ErrInvalidPolicy and ErrTooManyEntries when the count is
// over limit, at the line and column of the rule whose entries pass it.
func CountEntries(file string, policies []*policy.Policy, limit int) (EntryCount, error) {
	limit = max(limit, 1)
	c := newEntryCounter(policies, limit)
	count := c.count()
	if c.over == nil {
		return count, nil
	}
	s := c.over
	return count, &policyfile.FileError{File: file, Line: s.source.Line, Column: s.source.Column, Err: fmt.Errorf(
		"%w: policy %q: %s: the file's policies compute %s policy map entries (each CIDR's identity times the port blocks of the rules that select it), %w (%d, --policy-map-max-entries) from this rule on: write fewer CIDRs or port ranges, or raise --policy-map-max-entries",
		policyfile.ErrInvalidPolicy, s.policy, s.source.Name, count, ErrTooManyEntries, limit)}
}

// entryCounter counts the entries of a file's policies (CountEntries).
type entryCounter struct {
	limit      int
	index      selectorIndex
	identities [][]netip.Prefix // each identity's prefixes; world's are all addresses
	world      bool
	// denies and allows are one identity's distinct keys so far,
	// reused from identity to identity.
	denies, allows map[policy.Key]struct{}
	selected       []*selector

	total int
	exact bool
	// over is the selector whose key passed the limit, nil while within.
	over *selector
}

func newEntryCounter(policies []*policy.Policy, limit int) *entryCounter {
	c := &entryCounter{limit: limit, index: newSelectorIndex(), exact: true,
		denies: map[policy.Key]struct{}{}, allows: map[policy.Key]struct{}{}}
	peers := 0
	for _, p := range policies {
		peers += cidrPeers(p)
	}
	c.index.reserve(peers)
	prefixes := make([]netip.Prefix, 0, peers)
	for _, p := range policies {
		for _, dir := range policy.Directions() {
			rules := p.Rules(dir)
			for i := range rules {
				rule := &rules[i]
				if rule.AnyPeer {
					c.index.add(newSelector(p, dir, rule, nil))
				}
				c.index.addPeers(p, dir, rule)
				for j := range rule.Peers {
					peer := &rule.Peers[j]
					prefixes = append(prefixes, peer.CIDR)
					prefixes = append(prefixes, peer.Except...)
					c.world = c.world || peer.CIDR.Bits() == 0
				}
			}
		}
	}
	slices.SortFunc(prefixes, prefixkey.Compare)
	// Each identity's prefixes are one element of the sorted prefixes: one
	// slice for all of them.
	prefixes = slices.Compact(prefixes)
	c.identities = make([][]netip.Prefix, len(prefixes), len(prefixes)+1)
	for i := range prefixes {
		c.identities[i] = prefixes[i : i+1 : i+1]
	}
	if c.world {
		c.identities = append(c.identities, policy.WorldPrefixes())
	}
	return c
}

// count counts identity by identity: identity 0 first, then the prefixes'
// in prefix order, then world, until the end or the count's own bound.
func (c *entryCounter) count() EntryCount {
	if len(c.index.anyPeer) > 0 && !c.countIdentity(c.index.anyPeer) {
		return EntryCount{Entries: c.total}
	}
	for _, prefixes := range c.identities {
		c.selected = c.selected[:0]
		for s := range c.index.candidates(prefixes) {
			if !s.peer.Excludes(prefixes) {
				c.selected = append(c.selected, s)
			}
		}
		if !c.countIdentity(c.selected) {
			return EntryCount{Entries: c.total}
		}
	}
	return EntryCount{Entries: c.total, Exact: true}
}

// countIdentity adds the entries that the selectors give one identity:
// its distinct deny keys, then its distinct allow keys that no deny key
// covers (resolve's result, without sorting the grants). It returns false
// when the count stops: an identity with more than limit keys, or more
// than countBeyond times the limit in all.
func (c *entryCounter) countIdentity(selectors []*selector) bool {
	clear(c.denies)
	clear(c.allows)
	covered := func(k policy.Key) (*policy.Entry, bool) {
		_, found := c.denies[k]
		return nil, found
	}
	for _, deny := range []bool{true, false} {
		for _, s := range selectors {
			if s.deny != deny {
				continue
			}
			for key := range s.keys(0) {
				if deny {
					if _, seen := c.denies[key]; seen {
						continue
					}
					c.denies[key] = struct{}{}
				} else {
					if _, seen := c.allows[key]; seen {
						continue
					}
					if len(c.denies) > 0 {
						if _, found := policy.LookupEntries(key, covered); found {
							continue
						}
					}
					c.allows[key] = struct{}{}
				}
				c.total++
				if c.total > c.limit && c.over == nil {
					c.over = s
				}
				if len(c.denies)+len(c.allows) > c.limit || c.total > countBeyond*c.limit {
					return false
				}
			}
		}
	}
	return true
}

// keys yields the selector's keys for identity id, as appendGrants
// appends them, one port range's blocks at a time (at most 30, on the
// stack).
func (s *selector) keys(id identity.Number) iter.Seq[policy.Key] {
	return func(yield func(policy.Key) bool) {
		base := policy.Key{Identity: id, Direction: s.direction}
		if len(s.ports) == 0 {
			yield(base)
			return
		}
		var blocks [32]policy.Key
		for _, pr := range s.ports {
			for _, key := range pr.AppendKeys(blocks[:0], base) {
				if !yield(key) {
					return
				}
			}
		}
	}
}
