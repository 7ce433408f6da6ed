// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// DefaultRoot is the default bpffs root (--bpf-root).
const DefaultRoot = "/sys/fs/bpf"

// PinDir returns the directory of the agent's pinned objects under a bpffs
// root: <bpf-root>/ipcache-agent.
func PinDir(bpfRoot string) string { return filepath.Join(bpfRoot, "ipcache-agent") }

// LinksDir returns the directory of the pinned TCX links.
func LinksDir(bpfRoot string) string { return filepath.Join(PinDir(bpfRoot), "links") }

// Pinned are the agent's maps, pinned under <bpf-root>/ipcache-agent/.
type Pinned struct {
	IPCache, Enforcement, Counters, Conntrack, ConntrackOpening, Revision *ebpf.Map
	// Policies is the outer policy map, pinned as PolicyName (PoliciesSpec);
	// Policy is the host-wide default's map in it (subject 0), which
	// Open makes sure is there.
	Policies, Policy *ebpf.Map
	// Endpoints is the endpoints map (EndpointsSpec).
	Endpoints *ebpf.Map
	// DNSProxy holds the DNS proxy's port (DNSProxySpec).
	DNSProxy *ebpf.Map
	// DNSAnswers is the ring buffer of DNS answers that bypassed the
	// proxy (DNSAnswersSpec), DNSAnswersLost its lost records.
	DNSAnswers, DNSAnswersLost *ebpf.Map
}

// Close closes the maps' descriptors; the maps stay pinned.
//
// Possible errors: a descriptor cannot be closed.
func (m *Pinned) Close() error {
	var errs []error
	for _, mp := range []*ebpf.Map{m.IPCache, m.Policies, m.Policy, m.Enforcement, m.Counters, m.Conntrack, m.ConntrackOpening, m.Revision, m.Endpoints, m.DNSProxy, m.DNSAnswers, m.DNSAnswersLost} {
		if mp != nil {
			errs = append(errs, mp.Close())
		}
	}
	return errors.Join(errs...)
}

// IPCacheEntry is an entry of the pinned ipcache map as the agent found it
// at start: a prefix and the identity the datapath mapped it to.
type IPCacheEntry struct {
	Prefix   netip.Prefix
	Identity identity.Number
}

// IPCacheSnapshot is what the pinned ipcache map held when the agent
// started, before anything wrote to it.
type IPCacheSnapshot struct {
	// Entries are the entries restore reads, in address order: the order
	// in which restore writes them, and in which they are resolved. They
	// are read from the map in this form once, here, where the map's
	// layout is known. A key with host bits set is read as its masked
	// prefix (the kernel's trie matches only the prefix's bits: it is that
	// prefix's entry, and the trie holds no other for the prefix).
	Entries []IPCacheEntry
	// Unreadable are the keys that are no prefix (unknown family, nonzero
	// cluster_id or pad, a length out of range): no row can want them,
	// and the first prune deletes them.
	Unreadable map[IPCacheKey]IPCacheValue
}

// Sizes are the max entries of the pinned maps that have a flag for it.
type Sizes struct {
	IPCache, Policy, Conntrack, ConntrackOpening uint32
}

// Open opens (or creates) the pinned maps in dir, as openPinnedMaps and
// openConntrackMaps say; devices are the --devices, whose entries a
// conntrack map of the previous layout is converted for.
//
// Possible errors: those of openPinnedMaps and openConntrackMaps, wrapped
// naming dir; nothing stays open then.
func Open(dir string, sizes Sizes, devices []string, log *slog.Logger) (*Pinned, error) {
	if err := makePinDir(dir); err != nil {
		return nil, fmt.Errorf("open pinned maps in %s: %w", dir, err)
	}
	// The conntrack maps preallocate their entries, most of a first
	// start's map creation: they are made while the others are.
	var (
		ct conntrackMaps
		wg sync.WaitGroup
	)
	wg.Go(func() { ct = openConntrackMaps(dir, sizes.Conntrack, sizes.ConntrackOpening, devices, log) })
	opened, err := openPinnedMaps(dir, sizes.IPCache, sizes.Policy, log)
	wg.Wait()
	if err := errors.Join(err, ct.err); err != nil {
		ct.close()
		if opened != nil {
			opened.Close()
		}
		return nil, fmt.Errorf("open pinned maps in %s: %w", dir, err)
	}
	opened.Conntrack, opened.ConntrackOpening = ct.conntrack, ct.opening
	return opened, nil
}

// makePinDir creates dir, private to the agent.
//
// Possible errors: dir cannot be created or made private.
func makePinDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", dir, err)
	}
	// Whoever can write here can change what is enforced: the pins are
	// the owner's only, also when the directory was made with a wider mode.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("make pin directory %s private (mode 0700): %w", dir, err)
	}
	return nil
}

// openPinnedMaps opens (or creates) the pinned maps in dir (made by
// makePinDir) but the conntrack maps. A pinned map of
// the expected layout is reused as it is; one that differs only in max
// entries is migrated: its entries are copied into a new map that replaces
// the pin by an atomic rename; one of another type, key or value size or
// flags, or a pin that is not a map, is reported and replaced by an empty
// map. A pin that cannot be opened for lack of permission or because bpffs
// is read-only is an error, not replaced: it may be a good map. Nothing is
// read from the ipcache map here: a migrated map holds what the pinned
// one held, a replaced one nothing, and the datapath reads the map it
// returns before anything writes to it (ReadIPCacheMap).
//
// Possible errors: a pin cannot be
// opened (permission, read-only bpffs), created or replaced; a map cannot
// be migrated because it holds more entries than the new max entries
// (nothing is changed then).
func openPinnedMaps(dir string, ipcacheMaxEntries, policyMaxEntries uint32, log *slog.Logger) (*Pinned, error) {
	maps := &Pinned{}
	var err error
	maps.IPCache, err = openPinnedMap(dir, IPCacheSpec(ipcacheMaxEntries), log)
	if err == nil {
		maps.Policies, maps.Policy, err = openPolicies(dir, policyMaxEntries, log)
	}
	if err == nil {
		// The previous layout (2 entries) is migrated: the default's
		// entries are where they were.
		maps.Enforcement, err = openPinnedMap(dir, EnforcementSpec(), log)
	}
	if err == nil {
		maps.Counters, err = openCountersMap(dir, CountersSpec(), log)
	}
	if err == nil {
		maps.Revision, err = openPinnedMap(dir, RevisionSpec(), log)
	}
	if err == nil {
		maps.Endpoints, err = openPinnedMap(dir, EndpointsSpec(), log)
	}
	if err == nil {
		// Kept across restarts like the others; the next agent writes its
		// own proxy's port.
		maps.DNSProxy, err = openPinnedMap(dir, DNSProxySpec(), log)
	}
	if err == nil {
		// Kept with its unread records and consumer position: what was
		// answered while no agent ran is read by the next.
		maps.DNSAnswers, err = openPinnedMap(dir, DNSAnswersSpec(), log)
	}
	if err == nil {
		maps.DNSAnswersLost, err = openPinnedMap(dir, DNSAnswersLostSpec(), log)
	}
	if err != nil {
		maps.Close()
		return nil, err
	}
	return maps, nil
}

// openPinnedMap returns the map pinned at dir/spec.Name, creating,
// migrating or replacing it as openPinnedMaps says.
func openPinnedMap(dir string, spec *ebpf.MapSpec, log *slog.Logger) (*ebpf.Map, error) {
	path := filepath.Join(dir, spec.Name)
	log = log.With("map", path)
	old, err := ebpf.LoadPinnedMap(path, nil)
	switch {
	case errors.Is(err, os.ErrNotExist):
		log.Info("Creating pinned map", "max-entries", spec.MaxEntries)
		return createPinned(spec, path)
	case errors.Is(err, unix.EROFS), errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		// The pin may well be a good map: replacing it would lose what it
		// holds (and could not work either).
		return nil, fmt.Errorf("open pinned map %s: %w (bpffs read-only, or not running as root?)", path, err)
	case err != nil:
		log.Warn("Pinned object is not a usable map; restoring nothing from it and replacing it", "error", err)
		return replacePinned(spec, path, nil)
	}

	if incompatible := layoutDifference(spec, old); incompatible != "" {
		log.Warn("Pinned map has another layout; restoring nothing from it and replacing it",
			"difference", incompatible)
		old.Close()
		return replacePinned(spec, path, nil)
	}
	if old.MaxEntries() == spec.MaxEntries {
		return old, nil
	}
	log.Info("Migrating pinned map to new max entries", "from", old.MaxEntries(), "to", spec.MaxEntries)
	defer old.Close()
	return replacePinned(spec, path, old)
}

// layoutDifference describes how a pinned map differs from spec in what
// cannot be migrated, or returns "".
func layoutDifference(spec *ebpf.MapSpec, m *ebpf.Map) string {
	switch {
	case m.Type() != spec.Type:
		return fmt.Sprintf("type %s, want %s", m.Type(), spec.Type)
	case m.KeySize() != spec.KeySize:
		return fmt.Sprintf("key size %d, want %d", m.KeySize(), spec.KeySize)
	case m.ValueSize() != spec.ValueSize:
		return fmt.Sprintf("value size %d, want %d", m.ValueSize(), spec.ValueSize)
	case m.Flags() != spec.Flags:
		return fmt.Sprintf("flags %#x, want %#x", m.Flags(), spec.Flags)
	case m.Type() == ebpf.RingBuf && m.MaxEntries() != spec.MaxEntries:
		// Records cannot be copied into another ring.
		return fmt.Sprintf("ring buffer size %d, want %d", m.MaxEntries(), spec.MaxEntries)
	}
	return ""
}

func createPinned(spec *ebpf.MapSpec, path string) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, fmt.Errorf("pin map %s: %w", path, err)
	}
	return m, nil
}

// replacePinned creates a map from spec, copies from's entries into it (if
// from is set), pins it beside path and renames it over path, so the pin
// never names a map with wrong contents.
func replacePinned(spec *ebpf.MapSpec, path string, from *ebpf.Map) (*ebpf.Map, error) {
	return replacePinnedWith(spec, path, from, copyEntries)
}

// replacePinnedWith is replacePinned with fill writing from's entries into
// the new map.
func replacePinnedWith(spec *ebpf.MapSpec, path string, from *ebpf.Map, fill func(from, to *ebpf.Map) error) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	if from != nil {
		if err := fill(from, m); err != nil {
			m.Close()
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
				return nil, fmt.Errorf("migrate map %s from max entries %d to %d: it holds more entries than that; "+
					"nothing was changed (the old map stays pinned and enforced): raise --%s-map-max-entries, "+
					"or run 'ipcache-agent cleanup' to start from empty maps: %w",
					path, from.MaxEntries(), spec.MaxEntries, spec.Name, err)
			}
			return nil, fmt.Errorf("migrate map %s: %w", path, err)
		}
	}
	tmp := path + "_new" // bpffs forbids dots in names
	os.Remove(tmp)       // left over from a crash during a previous replacement
	if err := m.Pin(tmp); err != nil {
		m.Close()
		return nil, fmt.Errorf("pin map %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		m.Unpin()
		m.Close()
		return nil, fmt.Errorf("replace pinned map %s: %w", path, err)
	}
	// Reopen through the new pin, so that the handle knows its pin path.
	m.Close()
	reopened, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open replaced map %s: %w", path, err)
	}
	return reopened, nil
}

// openCountersMap is openPinnedMap for the counters map, which moves a
// pinned map of the previous layout (8 entries: direction*4 + slot, three
// drop reasons) to the current one rather than copying entries by index,
// which would count the old egress slots as ingress ones.
//
// Possible errors: those of openPinnedMap; the old map cannot be read.
func openCountersMap(dir string, spec *ebpf.MapSpec, log *slog.Logger) (*ebpf.Map, error) {
	path := filepath.Join(dir, spec.Name)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil || old.MaxEntries() != previousCountersEntries || layoutDifference(spec, old) != "" {
		if err == nil {
			old.Close()
		}
		return openPinnedMap(dir, spec, log)
	}
	defer old.Close()
	log.Info("Migrating pinned counters map to the layout with more drop reasons", "map", path,
		"from", old.MaxEntries(), "to", spec.MaxEntries)
	return replacePinnedWith(spec, path, old, func(from, to *ebpf.Map) error {
		for index := uint32(0); index < previousCountersEntries; index++ {
			var perCPU []counterValue
			if err := from.Lookup(index, &perCPU); err != nil {
				return err
			}
			direction, slot := index/previousCountersSlots, index%previousCountersSlots
			if err := to.Put(direction*countersSlots+slot, perCPU); err != nil {
				return err
			}
		}
		return nil
	})
}

// openPolicyMap is openPinnedMap for the policy map, which also converts
// a pinned map of the previous layout (a hash with 8-byte keys, before
// port ranges) rather than replacing it by an empty one: the new map is
// filled with the old one's entries before it replaces the pin, so that
// the program loaded next enforces what the old one did from its first
// packet, while the old program keeps its old map until it is replaced
// (the kernel frees that map then: nothing else holds it).
//
// Possible errors: those of openPinnedMap; the old map cannot be read, or
// its entries do not fit in the new one (nothing is changed then).
func openPolicyMap(dir string, spec *ebpf.MapSpec, log *slog.Logger) (*ebpf.Map, error) {
	path := filepath.Join(dir, spec.Name)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil || old.Type() != ebpf.Hash || old.KeySize() != hashPolicyKeySize || old.ValueSize() != policyValueSize {
		if err == nil {
			old.Close()
		}
		return openPinnedMap(dir, spec, log)
	}
	defer old.Close()
	var converted, skipped int
	m, err := replacePinnedWith(spec, path, old, func(from, to *ebpf.Map) error {
		converted, skipped, err = convertHashPolicy(from, to)
		return err
	})
	if err != nil {
		return nil, err
	}
	log.Info("Converted pinned policy map of the previous layout (hash) to an LPM trie; "+
		"the old map is freed once the old program is replaced",
		"map", path, "entries", converted, "skipped-never-matched", skipped, "max-entries", spec.MaxEntries)
	return m, nil
}

// hashPolicyKeySize is the key size of the previous policy map layout:
// sec_identity u32 | direction u8 | protocol u8 | dport be16, in a hash.
const hashPolicyKeySize = 8

// hashPolicyKey is the key a rule had in the previous layout, whose
// program looked up the exact port, then port 0 (every port of the
// protocol), then protocol 0 (any protocol, port 0).
func hashPolicyKey(ident uint32, direction, protocol uint8, port uint16) policy.Key {
	key := policy.Key{Identity: identity.Number(ident), Direction: policy.Direction(direction)}
	if protocol == 0 {
		return key
	}
	key.Protocol, key.Port = policy.Protocol(protocol), port
	if port == 0 {
		key.PortWildcardBits = 16
	}
	return key
}

// convertHashPolicy writes every entry of a policy map of the previous
// layout into to, in the LPM layout. An entry of protocol 0 with a port
// was never looked up by the previous program: it is skipped, not made an
// any-protocol entry.
func convertHashPolicy(from, to *ebpf.Map) (converted, skipped int, err error) {
	var putErr error
	err = ReadEntries(from, func(k [hashPolicyKeySize]byte, v PolicyValue) {
		if putErr != nil {
			return
		}
		protocol, port := k[5], binary.BigEndian.Uint16(k[6:8])
		if protocol == 0 && port != 0 {
			skipped++
			return
		}
		key := NewPolicyKey(hashPolicyKey(binary.LittleEndian.Uint32(k[0:4]), k[4], protocol, port))
		if putErr = to.Put(&key, &v); putErr != nil {
			putErr = fmt.Errorf("copy entry %d: %w", converted+1, putErr)
			return
		}
		converted++
	})
	return converted, skipped, errors.Join(err, putErr)
}

// copyEntries copies every entry of from into to.
//
// Possible errors: to has no room for all of them (nothing is lost: the
// old map stays pinned).
func copyEntries(from, to *ebpf.Map) error {
	key := make([]byte, from.KeySize())
	value := make([]byte, from.ValueSize())
	if from.Type() == ebpf.PerCPUArray || from.Type() == ebpf.PerCPUHash {
		return fmt.Errorf("migrating per-CPU maps is not supported")
	}
	iter := from.Iterate()
	n := 0
	for iter.Next(&key, &value) {
		if err := to.Put(key, value); err != nil {
			return fmt.Errorf("copy entry %d: %w", n+1, err)
		}
		n++
	}
	return iter.Err()
}

// ReadIPCacheMap reads every entry of an ipcache map. Entries whose key is no
// prefix are kept apart with a warning: restore must not act on what it
// cannot read, and the first prune deletes them.
//
// The map does not say how many entries it holds: they are read into
// blocks of a fixed size, joined once into a slice of the exact size.
// Appending to one slice instead copies it at every growth (by a quarter
// at this size), which cost more than reading the map (docs/SCALE.md).
// publish, if set, is given each block as it is read (in the kernel's
// order, before the join); it must not modify it.
//
// Possible errors: the map cannot be read (wrapped).
func ReadIPCacheMap(m BatchLookuper, log *slog.Logger, publish func([]IPCacheEntry)) (IPCacheSnapshot, error) {
	snapshot := IPCacheSnapshot{Unreadable: map[IPCacheKey]IPCacheValue{}}
	var (
		blocks [][]IPCacheEntry
		block  []IPCacheEntry
		total  int
	)
	err := ReadEntries(m, func(key IPCacheKey, value IPCacheValue) {
		prefix, err := key.decode()
		if err != nil {
			log.Warn("Unreadable pinned ipcache entry: not restored, deleted at the first prune", "error", err)
			snapshot.Unreadable[key] = value
			return
		}
		if masked := prefix.Masked(); masked != prefix {
			log.Warn("Pinned ipcache entry with host bits set: read as its prefix", "key", prefix, "prefix", masked)
			prefix = masked
		}
		if block == nil {
			block = make([]IPCacheEntry, 0, readBatchSize)
		}
		block = append(block, IPCacheEntry{Prefix: prefix, Identity: value.Identity()})
		if len(block) == cap(block) {
			if publish != nil {
				publish(block)
			}
			blocks, block = append(blocks, block), nil
		}
		total++
	})
	if err != nil {
		return IPCacheSnapshot{}, fmt.Errorf("dump ipcache map: %w", err)
	}
	if block != nil {
		if publish != nil {
			publish(block)
		}
		blocks = append(blocks, block)
	}
	// Joined into a new slice also from a single block: the sort below
	// must not reorder a block published.
	if len(blocks) > 0 {
		snapshot.Entries = make([]IPCacheEntry, 0, total)
		for _, b := range blocks {
			snapshot.Entries = append(snapshot.Entries, b...)
		}
	}
	slices.SortFunc(snapshot.Entries, func(a, b IPCacheEntry) int { return prefixkey.Compare(a.Prefix, b.Prefix) })
	// The kernel's trie holds one entry per prefix; were a masked key
	// read beside its prefix's own, one entry is kept, as a map of the
	// entries would: the writer finds an entry by its prefix
	// (mapwrite.NewSnapshotValues), and restore restores each prefix once.
	snapshot.Entries = slices.CompactFunc(snapshot.Entries, func(a, b IPCacheEntry) bool { return a.Prefix == b.Prefix })
	return snapshot, nil
}
