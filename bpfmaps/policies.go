// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// PolicyOf returns the policy map of a subject in the outer policy map
// (a new descriptor, which the caller closes).
//
// Possible errors: the subject has no map (ebpf.ErrKeyNotExist, wrapped);
// the map cannot be opened by its ID (no permission, or it went away).
func PolicyOf(outer *ebpf.Map, subject identity.Number) (*ebpf.Map, error) {
	// The kernel answers a lookup of a map of maps with the inner map's ID.
	var id uint32
	if err := outer.Lookup(uint32(subject), &id); err != nil {
		return nil, fmt.Errorf("look up the policy map of subject %d: %w", subject, err)
	}
	m, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return nil, fmt.Errorf("open the policy map of subject %d (map ID %d): %w", subject, id, err)
	}
	return m, nil
}

// AddPolicyOf creates an empty policy map (PolicySpec(maxEntries)) for a
// subject that has none and inserts it into the outer policy map. It
// returns the new map, which the caller closes (the outer map keeps it).
//
// Possible errors: the subject has a map already (ebpf.ErrKeyExist,
// wrapped); the map cannot be created or inserted.
func AddPolicyOf(outer *ebpf.Map, subject identity.Number, maxEntries uint32) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(PolicySpec(maxEntries))
	if err != nil {
		return nil, fmt.Errorf("create the policy map of subject %d: %w", subject, err)
	}
	if err := outer.Update(uint32(subject), m, ebpf.UpdateNoExist); err != nil {
		m.Close()
		return nil, fmt.Errorf("insert the policy map of subject %d: %w", subject, err)
	}
	return m, nil
}

// openPolicies opens (or creates) the outer policy map pinned in dir and
// the host-wide default's map in it (subject 0), each of innerMaxEntries.
//
// A pinned outer map of the expected layout is reused; its default's map
// is created if missing, and migrated if its max entries differ (a new
// map with its entries takes its place in one update: each packet sees
// the old or the new one). A pinned policy map of the previous layouts
// (a flat LPM trie, or a hash before it) becomes the default's map, as it
// is (converted first from a hash, migrated first to other max entries,
// as openPolicyMap does), inserted into a new outer map that then
// replaces the pin by an atomic rename: an old program that still uses
// the flat map reads what the agent writes into the default's map,
// which is the same map, until the new program replaces it. Anything
// else pinned there is replaced as openPinnedMap says.
//
// Possible errors: those of openPolicyMap and replacePinnedWith; the
// default's map cannot be read, created or inserted.
func openPolicies(dir string, innerMaxEntries uint32, log *slog.Logger) (outer, defaultMap *ebpf.Map, err error) {
	path := filepath.Join(dir, PolicyName)
	spec := PoliciesSpec(innerMaxEntries)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil && old.Type() == ebpf.HashOfMaps {
		outer = old
		if diff := layoutDifference(spec, old); diff != "" || old.MaxEntries() != spec.MaxEntries {
			old.Close()
			log.Warn("Pinned policy map has another layout; restoring nothing from it and replacing it",
				"map", path, "difference", diff, "max-entries", old.MaxEntries())
			if outer, err = replacePinned(spec, path, nil); err != nil {
				return nil, nil, err
			}
		}
		defaultMap, err = openDefaultPolicy(outer, innerMaxEntries, log.With("map", path))
		if err != nil {
			outer.Close()
			return nil, nil, err
		}
		return outer, defaultMap, nil
	}
	if err == nil {
		old.Close()
	}
	defaultMap, err = openPolicyMap(dir, PolicySpec(innerMaxEntries), log)
	if err != nil {
		return nil, nil, err
	}
	outer, err = replacePinnedWith(spec, path, defaultMap, func(from, to *ebpf.Map) error {
		return to.Update(uint32(0), from, ebpf.UpdateNoExist)
	})
	if err != nil {
		defaultMap.Close()
		return nil, nil, err
	}
	log.Info("Policy map pinned as a map of each subject's policy map; the flat one is the host-wide default's",
		"map", path, "max-entries", innerMaxEntries)
	return outer, defaultMap, nil
}

// openDefaultPolicy returns the default's map in outer, creating or
// migrating it as openPolicies says.
func openDefaultPolicy(outer *ebpf.Map, maxEntries uint32, log *slog.Logger) (*ebpf.Map, error) {
	current, err := PolicyOf(outer, 0)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		log.Info("Creating the host-wide default's policy map", "max-entries", maxEntries)
		return AddPolicyOf(outer, 0, maxEntries)
	}
	if err != nil {
		return nil, err
	}
	if current.MaxEntries() == maxEntries {
		return current, nil
	}
	defer current.Close()
	log.Info("Migrating the host-wide default's policy map to new max entries",
		"from", current.MaxEntries(), "to", maxEntries)
	m, err := ebpf.NewMap(PolicySpec(maxEntries))
	if err != nil {
		return nil, fmt.Errorf("create the default's policy map: %w", err)
	}
	if err := copyEntries(current, m); err != nil {
		m.Close()
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
			return nil, fmt.Errorf("migrate the default's policy map from max entries %d to %d: it holds more "+
				"entries than that; nothing was changed: raise --%s-map-max-entries, or run 'ipcache-agent "+
				"cleanup' to start from empty maps: %w", current.MaxEntries(), maxEntries, PolicyName, err)
		}
		return nil, fmt.Errorf("migrate the default's policy map: %w", err)
	}
	if err := outer.Update(uint32(0), m, ebpf.UpdateExist); err != nil {
		m.Close()
		return nil, fmt.Errorf("replace the default's policy map: %w", err)
	}
	return m, nil
}
