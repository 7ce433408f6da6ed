// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The deny guard keeps a deny from failing open when a map is full
// (README.md, "Full maps: a deny never fails open"; docs/FAULTS.md).
//
// What the program decides for a packet follows from two lookups: the
// ipcache map gives the remote address an identity, the policy map that
// identity's (and identity 0's) verdict. A deny can be missing from the
// maps in two ways:
//
//   - its policy-map entry did not fit: the lookup finds the identity's
//     wider (or narrower) allow instead, or identity 0's;
//   - the ipcache entry of its prefix (or of a CIDR's except prefix) did
//     not fit or is held (make before break): the address gets the
//     identity of a wider prefix in the map, or world, whose entries may
//     allow what the prefix's identity denies.
//
// Neither can be fixed by writing what is missing: there is no room. So
// the guard makes what the lookups find instead deny: it writes deny in
// place over the allow entries those packets would meet (an update in
// place needs no room), and for a prefix that falls back to another
// identity, a copy of the prefix identity's deny entry under that
// identity when it fits (a "shadow"; else the wider allows are overwritten
// too). This denies more than the policies do (the rest of the wider
// prefix, of world, or of the identity, for the same ports), which is
// the price of never passing what a deny drops: the map cannot hold what
// tells the two apart. Once what was missing is written, the guarded
// entries get their desired values back, after it, so the denied
// packets never pass in between.
//
// What is guarded is recomputed as a whole (reguardLocked) from what is
// missing: the deny entries whose write failed, and the ipcache keys the
// map holds back with the identity it gives their addresses instead. New
// guards are written before the ones no longer needed are released.

// guardKind is how the guard holds a policy-map key.
type guardKind uint8

const (
	// guardOverride: an entry the map has, whose value is now deny
	// instead of its row's allow.
	guardOverride guardKind = iota + 1
	// guardShadow: a deny entry no row asks for.
	guardShadow
)

// denyGuard is policyOps' state of the guard; its lock is policyOps'.
type denyGuard struct {
	// failedDenies are the deny entries whose last write failed.
	failedDenies map[bpfmaps.PolicyKey]policy.Key
	// guarded are the keys the guard wrote deny to.
	guarded map[bpfmaps.PolicyKey]guardKind
	// heldIPCache returns the ipcache keys the map holds back, with the
	// identity their addresses get from the map (0: none, world).
	heldIPCache func() map[bpfmaps.IPCacheKey]identity.Number
	// ipcacheEntry returns the desired identity of an ipcache prefix.
	ipcacheEntry func(txn statedb.ReadTxn, prefix netip.Prefix) (identity.Number, bool)
	// uncovered says, per direction, that a deny not in the maps has no
	// policy-map entry around it to write deny over (neither its
	// identity's nor identity 0's): its packets match nothing, which a
	// direction of deny rules only passes. The enforcement writer then
	// enforces that direction with default deny (failClosed).
	uncovered [2]bool
	// uncoveredChanged is closed when uncovered changes.
	uncoveredChanged chan struct{}
}

// failClosed returns the directions whose missing denies nothing in the
// policy map covers (denyGuard.uncovered), and a channel closed when that
// changes.
func (p *policyOps) failClosed() ([2]bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.guard.uncoveredChanged == nil {
		p.guard.uncoveredChanged = make(chan struct{})
	}
	return p.guard.uncovered, p.guard.uncoveredChanged
}

// setUncoveredLocked records uncovered and wakes whoever waits on it.
func (p *policyOps) setUncoveredLocked(uncovered [2]bool) {
	if uncovered == p.guard.uncovered {
		return
	}
	p.guard.uncovered = uncovered
	if p.guard.uncoveredChanged != nil {
		close(p.guard.uncoveredChanged)
	}
	p.guard.uncoveredChanged = make(chan struct{})
}

var denyValue = bpfmaps.NewPolicyValue(uint32(policy.VerdictDeny))

// mapEntry is a policy-map entry as the guard reads it.
type mapEntry struct {
	key     policy.Key
	verdict policy.Verdict
}

// sameIdentity returns k with identity id: the guard compares keys of
// different identities by their direction, protocol and ports.
func sameIdentity(k policy.Key, id identity.Number) policy.Key {
	k.Identity = id
	return k
}

// overlap reports whether two keys of one identity and direction match a
// common packet: LPM prefixes that share a point are nested.
func overlap(a, b policy.Key) bool { return a.Matches(b) || b.Matches(a) }

// denyResult records the outcome of a write of a deny entry.
func (p *policyOps) denyResult(k bpfmaps.PolicyKey, e *policy.Entry, err error) {
	if e.Verdict == policy.VerdictDeny && err != nil {
		if p.guard.failedDenies == nil {
			p.guard.failedDenies = map[bpfmaps.PolicyKey]policy.Key{}
		}
		p.guard.failedDenies[k] = e.Key
		return
	}
	delete(p.guard.failedDenies, k)
}

// guardedAllowLocked reports whether writing v to k would undo a guard:
// the row's allow waits until the guard releases k.
func (p *policyOps) guardedAllowLocked(k bpfmaps.PolicyKey, v bpfmaps.PolicyValue) bool {
	_, ok := p.guard.guarded[k]
	return ok && v != denyValue
}

// guardActive reports whether the guard has anything to do.
func (p *policyOps) guardActiveLocked() bool {
	return len(p.guard.failedDenies) > 0 || len(p.guard.guarded) > 0 || p.order.numHeld.Load() > 0
}

// Reguard recomputes the guard after the ipcache writer's round, with
// the tables as txn has them (the ipcache writer calls it).
func (p *policyOps) Reguard(txn statedb.ReadTxn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reguardLocked(txn)
}

// reguardLocked makes the guarded keys what the missing entries need:
// new guards first, then the release of those no longer needed.
func (p *policyOps) reguardLocked(txn statedb.ReadTxn) {
	if !p.guardActiveLocked() {
		p.setUncoveredLocked([2]bool{})
		return
	}
	if p.db != nil {
		// The newest tables, not the caller's snapshot: the ipcache
		// writer's round read its snapshot before its gate waited for the
		// selectors, so a held prefix's identity may have no rows in it
		// yet, which would read as "allows nothing" and deny its fallback.
		txn = p.db.ReadTxn()
	}
	if txn == nil {
		return
	}
	inMap := map[identity.Number][]mapEntry{}
	err := bpfmaps.ReadEntries(p.ops.Target(), func(mk bpfmaps.PolicyKey, v bpfmaps.PolicyValue) {
		k, err := mk.Key()
		if err != nil {
			return
		}
		verdict := policy.Verdict(v.Verdict())
		if p.guard.guarded[mk] == guardOverride {
			verdict = policy.VerdictAllow // an allow (or dns-proxy) without the guard: as an allow here
		}
		if p.guard.guarded[mk] == guardShadow {
			return
		}
		inMap[k.Identity] = append(inMap[k.Identity], mapEntry{k, verdict})
	})
	if err != nil {
		p.log.Error("Cannot read the policy map to guard the deny entries that are not in the maps", "error", err)
		return
	}

	override := map[bpfmaps.PolicyKey]struct{}{}
	// allowsOver marks the allows of id that a packet of d meets: every
	// allow overlapping d, or with inside only those inside d (a shadow
	// or the identity's own deny covers the rest). It reports whether id
	// has a key covering d.
	allowsOver := func(id identity.Number, d policy.Key, inside bool) (covered bool) {
		d = sameIdentity(d, id)
		for _, e := range inMap[id] {
			if e.key.Matches(d) {
				covered = true
			}
			if !e.verdict.Allows() || !overlap(e.key, d) || (inside && !d.Matches(e.key)) {
				continue
			}
			override[bpfmaps.NewPolicyKey(e.key)] = struct{}{}
		}
		return covered
	}

	// A deny entry that did not fit: its identity's allows around it, and
	// identity 0's if the identity has no key covering it. Covered by
	// neither, its packets match nothing.
	var uncovered [2]bool
	cover := func(d policy.Key) {
		covered := allowsOver(d.Identity, d, false)
		if !covered && d.Identity != 0 {
			covered = allowsOver(0, d, false)
		}
		if !covered && int(d.Direction) < len(uncovered) {
			uncovered[d.Direction] = true
		}
	}
	for _, d := range p.guard.failedDenies {
		cover(d)
	}

	// An ipcache entry not in the map: its addresses get identity f.
	shadow := map[bpfmaps.PolicyKey]policy.Key{}
	if p.order.numHeld.Load() > 0 && p.guard.heldIPCache != nil {
		for k, inMapID := range p.guard.heldIPCache() {
			prefix, err := k.Prefix()
			if err != nil {
				continue
			}
			id, ok := p.guard.ipcacheEntry(txn, prefix)
			f := identity.Number(inMapID)
			if f == 0 {
				f = identity.World
			}
			if !ok || identity.Number(id) == f {
				continue
			}
			p.guardFallbackLocked(txn, identity.Number(id), f, inMap, shadow, allowsOver, override, cover)
		}
	}

	// Write the new guards: shadows first (a shadow that does not fit
	// makes the allows around it deny instead), then overrides.
	target := p.ops.Target()
	for mk, d := range shadow {
		if _, ok := p.guard.guarded[mk]; ok {
			continue
		}
		if err := target.Put(&mk, &denyValue); err != nil {
			cover(d)
			delete(shadow, mk)
			continue
		}
		p.guardedLocked(mk, guardShadow)
	}
	for mk := range override {
		if _, ok := p.guard.guarded[mk]; ok {
			continue
		}
		if err := target.Put(&mk, &denyValue); err != nil {
			p.log.Error("Cannot write deny over a policy map entry to guard a deny that is not in the maps", "key", mk, "error", err)
			continue
		}
		p.guardedLocked(mk, guardOverride)
	}

	p.setUncoveredLocked(uncovered)

	// Release what is no longer needed.
	for mk, kind := range p.guard.guarded {
		if _, ok := override[mk]; ok && kind == guardOverride {
			continue
		}
		if _, ok := shadow[mk]; ok && kind == guardShadow {
			continue
		}
		p.releaseLocked(txn, mk)
	}
}

// guardFallbackLocked adds what makes identity f, which the map gives the
// addresses of a prefix of identity id, pass nothing that id drops: a
// shadow of each deny of id that f does not deny (with the allows of f
// inside it), and deny over each allow of f that no allow of id covers
// (an except prefix falling back to its CIDR).
func (p *policyOps) guardFallbackLocked(txn statedb.ReadTxn, id, f identity.Number,
	inMap map[identity.Number][]mapEntry, shadow map[bpfmaps.PolicyKey]policy.Key,
	allowsOver func(identity.Number, policy.Key, bool) bool, override map[bpfmaps.PolicyKey]struct{},
	cover func(policy.Key)) {
	var allows []policy.Key
	for e := range policy.IdentityEntries(txn, p.order.entries, id) {
		if e.Verdict.Allows() {
			allows = append(allows, e.Key)
			continue
		}
		d := sameIdentity(e.Key, f)
		denied := false
		for _, fe := range inMap[f] {
			if fe.verdict == policy.VerdictDeny && fe.key.Matches(d) {
				denied = true
				break
			}
		}
		if denied {
			continue
		}
		// A deny whose own entry did not fit gets no shadow: the shadow
		// would take the room that entry waits for (and the prefix is
		// held until it is in), so neither would ever be written. Deny
		// is written over what its packets meet under f instead.
		if _, failed := p.guard.failedDenies[bpfmaps.NewPolicyKey(e.Key)]; failed {
			cover(d)
			continue
		}
		shadow[bpfmaps.NewPolicyKey(d)] = d
		allowsOver(f, d, true)
	}
	for _, fe := range inMap[f] {
		if !fe.verdict.Allows() {
			continue
		}
		covered := false
		for _, a := range allows {
			if sameIdentity(a, f).Matches(fe.key) {
				covered = true
				break
			}
		}
		if !covered {
			override[bpfmaps.NewPolicyKey(fe.key)] = struct{}{}
		}
	}
}

// guardedLocked records a key the guard wrote deny to; the copy of the
// map's values (mapwrite.Ops skips unchanged writes) no longer knows it.
func (p *policyOps) guardedLocked(mk bpfmaps.PolicyKey, kind guardKind) {
	if p.guard.guarded == nil {
		p.guard.guarded = map[bpfmaps.PolicyKey]guardKind{}
	}
	if len(p.guard.guarded) == 0 {
		p.log.Warn("A deny is not in the maps (a map is full): entries it would pass through are written as deny until it is (bpf/policy --diff shows them)",
			"key", mk)
	}
	p.guard.guarded[mk] = kind
	p.ops.ForgetValue(mk)
}

// releaseLocked gives a guarded key its row's value back, or deletes it
// if no row has it (a key that drains is the drain's to delete).
func (p *policyOps) releaseLocked(txn statedb.ReadTxn, mk bpfmaps.PolicyKey) {
	target := p.ops.Target()
	var err error
	k, kerr := mk.Key()
	if row, _, found := p.order.entries.Get(txn, policy.KeyIndex.Query(k)); kerr == nil && found {
		v := bpfmaps.NewPolicyValue(uint32(row.Verdict))
		err = target.Put(&mk, &v)
	} else if _, draining := p.draining[mk]; !draining {
		if err = target.Delete(&mk); errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
	}
	if err != nil {
		// Kept guarded (deny): retried at the next recomputation.
		p.log.Error("Cannot give a guarded policy map entry its value back; retried", "key", mk, "error", err)
		return
	}
	delete(p.guard.guarded, mk)
	if len(p.guard.guarded) == 0 {
		p.log.Info("Every deny is in the maps again: the entries written as deny in its place have their values back")
	}
}

// DenyGuard returns the policy-map keys that the deny guard holds as
// deny for a deny that is not in the maps (a full map), each with how:
// "override" (an allow entry of the `policy` table, written as deny) or
// "shadow" (a deny entry no row has). Empty while every deny is in the
// maps, and before start.
func (d *Datapath) DenyGuard() map[policy.Key]string {
	if d.policyOps == nil {
		return map[policy.Key]string{}
	}
	return d.policyOps.guardedKeys()
}

// guardedKeys returns the policy-map keys the guard wrote deny to.
func (p *policyOps) guardedKeys() map[policy.Key]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[policy.Key]string{}
	for mk, kind := range p.guard.guarded {
		k, err := mk.Key()
		if err != nil {
			continue
		}
		out[k] = map[guardKind]string{guardOverride: "override", guardShadow: "shadow"}[kind]
	}
	return out
}

// heldIPCacheIdentities returns a copy of the held ipcache keys with the
// identity the map gives their addresses.
func (o *ordering) heldIPCacheIdentities() map[bpfmaps.IPCacheKey]identity.Number {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[bpfmaps.IPCacheKey]identity.Number, len(o.held))
	for k, id := range o.held {
		out[k] = id
	}
	return out
}

// desiredIPCacheIdentity returns the desired identity of prefix.
func desiredIPCacheIdentity(table statedb.Table[*ipcachecell.Entry]) func(statedb.ReadTxn, netip.Prefix) (identity.Number, bool) {
	return func(txn statedb.ReadTxn, prefix netip.Prefix) (identity.Number, bool) {
		e, _, found := table.Get(txn, ipcachecell.EntryIndex.Query(prefix))
		if !found {
			return 0, false
		}
		return e.Identity, true
	}
}
