// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// ReadIPCache reads the ipcache map pinned under bpfRoot: prefix ->
// identity. It is for tools and tests that inspect what the datapath
// enforces; entries whose key is not in canonical form are skipped.
//
// Possible errors: no map pinned there, or no permission.
func ReadIPCache(bpfRoot string) (map[netip.Prefix]identity.Number, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(PinDir(bpfRoot), IPCacheName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned ipcache map: %w", err)
	}
	defer m.Close()
	snapshot, err := ReadIPCacheMap(m, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		return nil, err
	}
	pinned := make(map[netip.Prefix]identity.Number, len(snapshot.Entries))
	for _, e := range snapshot.Entries {
		pinned[e.Prefix] = e.Identity
	}
	return pinned, nil
}

// ReadPolicy reads the host-wide default's policy map (subject 0) of the
// policy map pinned under bpfRoot: key -> verdict.
//
// Possible errors: no map pinned there, or no permission.
func ReadPolicy(bpfRoot string) (map[PolicyKey]uint32, error) {
	outer, err := ebpf.LoadPinnedMap(filepath.Join(PinDir(bpfRoot), PolicyName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned policy map: %w", err)
	}
	defer outer.Close()
	m, err := PolicyOf(outer, 0)
	if err != nil {
		return nil, fmt.Errorf("open pinned policy map: %w", err)
	}
	defer m.Close()
	out := map[PolicyKey]uint32{}
	if err := ReadEntries(m, func(k PolicyKey, v PolicyValue) { out[k] = v.Verdict() }); err != nil {
		return nil, fmt.Errorf("read pinned policy map: %w", err)
	}
	return out, nil
}

// ReadEnforcement reads the host-wide default's entries (subject 0) of
// the enforcement map pinned under bpfRoot: whether each direction is
// enforced with default deny (value 1; a direction of deny rules only, 2,
// or without an entry reads false), indexed by direction (0 ingress, 1
// egress).
//
// Possible errors: no map pinned there, or no permission.
func ReadEnforcement(bpfRoot string) ([2]bool, error) {
	var enforced [2]bool
	m, err := ebpf.LoadPinnedMap(filepath.Join(PinDir(bpfRoot), EnforcementName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return enforced, fmt.Errorf("open pinned enforcement map: %w", err)
	}
	defer m.Close()
	for dir := range enforced {
		var v EnforcementValue
		key := NewEnforcementKey(0, policy.Direction(dir))
		err := m.Lookup(&key, &v)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return enforced, fmt.Errorf("read pinned enforcement map: %w", err)
		}
		enforced[dir] = err == nil && v == EnforceDefaultDeny
	}
	return enforced, nil
}

// readBatchSize is the entries read per batch lookup.
const readBatchSize = 4096

// BatchLookuper is what ReadEntries uses of a BPF map: an *ebpf.Map, or in
// tests a fake.
type BatchLookuper interface {
	BatchLookup(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, opts *ebpf.BatchOptions) (int, error)
	Iterate() *ebpf.MapIterator
}

var _ BatchLookuper = (*ebpf.Map)(nil)

// ReadEntries calls fn for every key and value of m. It reads in batches
// where the kernel can (LPM trie and hash maps: one system call per 4096
// entries, where iterating takes two per entry), else key by key. The map must not change meanwhile: the
// callers read before anything writes, or from the reconciler that alone
// writes the map.
//
// Possible errors: the kernel's, when the map cannot be read.
func ReadEntries[K, V any](m BatchLookuper, fn func(K, V)) error {
	var cursor ebpf.MapBatchCursor
	keys := make([]K, readBatchSize)
	values := make([]V, readBatchSize)
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		for i := range n {
			fn(keys[i], values[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil // read to the end
		case errors.Is(err, ebpf.ErrNotSupported) && n == 0:
			var (
				k K
				v V
			)
			iter := m.Iterate()
			for iter.Next(&k, &v) {
				fn(k, v)
			}
			return iter.Err()
		case err != nil:
			return err
		}
	}
}
