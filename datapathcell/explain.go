// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// mapsReader reads the maps the enforcement program looks up, for
// policycell's policy/explain: what the datapath really does with a
// packet, which differs from the desired tables while entries cannot be
// written (a full policy map) or are held.
type mapsReader struct{ d *Datapath }

var _ policy.Datapath = mapsReader{}

func newDatapathMaps(d *Datapath) policy.Datapath { return mapsReader{d} }

// lookup looks key up in the map that which picks, under the datapath's
// lock so that a stop does not close the map meanwhile. found is false if
// the map has no such key.
func (r mapsReader) lookup(which func(writtenMaps) mapwrite.Map, key, value any) (found bool, err error) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	var m mapwrite.Map
	switch {
	case r.d.fakeMaps != nil:
		m = which(*r.d.fakeMaps)
	case r.d.maps != nil:
		m = which(writtenMaps{ipcache: r.d.maps.IPCache, policy: r.d.maps.Policy, enforcement: r.d.maps.Enforcement})
	}
	if m == nil {
		return false, ErrMapsNotOpen
	}
	err = m.Lookup(key, value)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	return err == nil, err
}

// LookupIdentity implements policy.Datapath: a lookup of the
// address's full-length key in the LPM trie finds the longest prefix
// containing it, as the program's does.
func (r mapsReader) LookupIdentity(addr netip.Addr) (identity.Number, bool, error) {
	k := bpfmaps.NewIPCacheKey(netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()))
	var v bpfmaps.IPCacheValue
	found, err := r.lookup(func(m writtenMaps) mapwrite.Map { return m.ipcache }, &k, &v)
	if err != nil {
		return 0, false, fmt.Errorf("look up %s in the ipcache map: %w", addr, err)
	}
	return identity.Number(v.Identity()), found, nil
}

// LookupPolicy implements policy.Datapath: the kernel's lookup
// of key's map key (the program's lookup, at bpfmaps.PolicyPrefixLen(key)) gives
// the verdict; the entry it found is named by reading the map, the
// longest of its keys that match. The map is key.Subject's.
func (r mapsReader) LookupPolicy(key policy.Key) (matched policy.Key, verdict policy.Verdict, found bool, err error) {
	err = r.withPolicy(key.Subject, func(m mapwrite.Map) error {
		k := bpfmaps.NewPolicyKey(key)
		var v bpfmaps.PolicyValue
		if err := m.Lookup(&k, &v); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return nil
			}
			return err
		}
		var err error
		matched, found, err = longestMatch(m, key)
		verdict = policy.Verdict(v.Verdict())
		return err
	})
	if err != nil {
		return policy.Key{}, 0, false, fmt.Errorf("look up %s in the policy map: %w", key, err)
	}
	if !found {
		return policy.Key{}, 0, false, nil
	}
	return matched, verdict, true, nil
}

// withPolicy calls fn with subject's policy map (a map without keys if the
// subject has none in the outer map), which stays open meanwhile.
func (r mapsReader) withPolicy(subject identity.Number, fn func(mapwrite.Map) error) error {
	if subject != identity.Unknown {
		if r.d.subjects == nil {
			return fn(emptyMap{})
		}
		return r.d.subjects.withMap(subject, func(m mapwrite.Map) error {
			if m == nil {
				m = emptyMap{}
			}
			return fn(m)
		})
	}
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	var m mapwrite.Map
	switch {
	case r.d.fakeMaps != nil:
		m = r.d.fakeMaps.policy
	case r.d.maps != nil:
		m = r.d.maps.Policy
	}
	if m == nil {
		return ErrMapsNotOpen
	}
	return fn(m)
}

// longestMatch returns the policy map's longest key whose prefix key
// matches, as the LPM trie's lookup finds it.
func longestMatch(m mapwrite.Map, key policy.Key) (matched policy.Key, found bool, err error) {
	err = bpfmaps.ReadEntries(m, func(k bpfmaps.PolicyKey, _ bpfmaps.PolicyValue) {
		entry, err := k.Key()
		if err != nil || bpfmaps.PolicyPrefixLen(entry) > bpfmaps.PolicyPrefixLen(key) || (found && bpfmaps.PolicyPrefixLen(entry) <= bpfmaps.PolicyPrefixLen(matched)) {
			return
		}
		if bpfmaps.NewPolicyKey(bpfmaps.PolicyKeyAt(key, bpfmaps.PolicyPrefixLen(entry))) == k {
			matched, found = entry, true
			matched.Subject = key.Subject
		}
	})
	return matched, found, err
}

// emptyMap is a map without keys: the policy of a subject without a map.
type emptyMap struct{ mapwrite.Map }

func (emptyMap) Lookup(any, any) error { return ebpf.ErrKeyNotExist }
func (emptyMap) BatchLookup(*ebpf.MapBatchCursor, any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrKeyNotExist
}

// Enforcement implements policy.Datapath: the enforcement map's
// value for subject's dir (bpfmaps/abi.go); no entry is not enforced.
func (r mapsReader) Enforcement(subject identity.Number, dir policy.Direction) (policy.EnforcementMode, error) {
	k := bpfmaps.NewEnforcementKey(subject, dir)
	var v bpfmaps.EnforcementValue
	found, err := r.lookup(func(m writtenMaps) mapwrite.Map { return m.enforcement }, &k, &v)
	if err != nil {
		return policy.NotEnforced, fmt.Errorf("look up %s in the enforcement map: %w", dir, err)
	}
	switch {
	case !found:
		return policy.NotEnforced, nil
	case v == bpfmaps.EnforceDefaultDeny:
		return policy.DefaultDeny, nil
	case v == bpfmaps.EnforceDenyOnly:
		return policy.DenyOnly, nil
	case v == bpfmaps.EnforceDropAll:
		return policy.DropAll, nil
	}
	return policy.NotEnforced, nil
}

// IPCacheStatus implements policy.Datapath.
func (r mapsReader) IPCacheStatus(rev statedb.Revision) (reconciler.StatusKind, error) {
	return r.d.IPCacheStatus(rev)
}

// LookupEndpoint implements policy.Datapath: the endpoints map's entry
// for addr, as the program looks it up (an exact address).
func (r mapsReader) LookupEndpoint(addr netip.Addr) (identity.Number, uint32, bool, error) {
	return r.d.lookupEndpoint(addr)
}
