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
// longest of its keys that match.
func (r mapsReader) LookupPolicy(key policy.Key) (policy.Key, policy.Verdict, bool, error) {
	k := bpfmaps.NewPolicyKey(key)
	var v bpfmaps.PolicyValue
	found, err := r.lookup(func(m writtenMaps) mapwrite.Map { return m.policy }, &k, &v)
	if err == nil && found {
		var matched policy.Key
		matched, found, err = r.longestMatch(key)
		if err == nil && found {
			return matched, policy.Verdict(v.Verdict()), true, nil
		}
	}
	if err != nil {
		return policy.Key{}, 0, false, fmt.Errorf("look up %s in the policy map: %w", key, err)
	}
	return policy.Key{}, 0, false, nil
}

// longestMatch returns the policy map's longest key whose prefix key
// matches, as the LPM trie's lookup finds it.
func (r mapsReader) longestMatch(key policy.Key) (matched policy.Key, found bool, err error) {
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
		return matched, false, ErrMapsNotOpen
	}
	err = bpfmaps.ReadEntries(m, func(k bpfmaps.PolicyKey, _ bpfmaps.PolicyValue) {
		entry, err := k.Key()
		if err != nil || bpfmaps.PolicyPrefixLen(entry) > bpfmaps.PolicyPrefixLen(key) || (found && bpfmaps.PolicyPrefixLen(entry) <= bpfmaps.PolicyPrefixLen(matched)) {
			return
		}
		if bpfmaps.NewPolicyKey(bpfmaps.PolicyKeyAt(key, bpfmaps.PolicyPrefixLen(entry))) == k {
			matched, found = entry, true
		}
	})
	return matched, found, err
}

// Enforcement implements policy.Datapath: the enforcement map's
// value for dir (bpfmaps/abi.go).
func (r mapsReader) Enforcement(subject identity.Number, dir policy.Direction) (enforced, denyOnly bool, err error) {
	if subject != identity.Unknown {
		return false, false, nil
	}
	k := uint32(dir)
	var v bpfmaps.EnforcementValue
	found, err := r.lookup(func(m writtenMaps) mapwrite.Map { return m.enforcement }, &k, &v)
	if err != nil {
		return false, false, fmt.Errorf("look up %s in the enforcement map: %w", dir, err)
	}
	return found && v == bpfmaps.EnforceDefaultDeny, found && v == bpfmaps.EnforceDenyOnly, nil
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
