// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/identity"
)

// Datapath owns the pinned BPF maps (and the enforcement program on the
// devices). Its start hook runs before any reconciler writes: it mounts
// bpffs if needed, opens, migrates or replaces the pinned maps, and starts
// the read of the pinned ipcache map that restore takes.
type Datapath struct {
	cfg Config
	// conntrack sizes the conntrack maps and sets the program's timeouts.
	conntrack bpfmaps.ConntrackConfig
	log       *slog.Logger

	// stats of each map's reconciler, by map name; fixed at construction.
	stats map[string]*mapwrite.Stats

	mu       sync.Mutex
	maps     *bpfmaps.Pinned
	snapshot bpfmaps.IPCacheSnapshot
	// snapshotErr is the error of reading the snapshot, if it failed.
	snapshotErr error
	enforcer    *enforcer
	// endpointFilter is the program's endpoint_absent as the endpoints
	// writer last set it (nil: not yet, every bit clear), endpointWords
	// its endpoint_words (nil: not yet, none).
	endpointFilter *endpointFilter
	endpointWords  endpointWords
	// snapshotTaken is closed once the pinned ipcache map is read (or
	// its read failed): the map's writer waits for it.
	snapshotTaken chan struct{}
	// stream takes the read's blocks as they come, for restore
	// (bpfmaps.PinnedIPCache); the start does not wait for the read,
	// which runs on a goroutine that Stop waits for (reading).
	stream  *pinnedIPCacheStream
	reading sync.WaitGroup
	// revision is bumped after every write to the maps the writers write
	// (revision.go); set at start.
	revision *revisionCounter

	// order and policyOps are the map writers' shared state, set at
	// registration.
	order         *ordering
	policyOps     *policyOps
	ipcacheWriter *ipcacheWriter
	// subjects and endpoints are the writers of the subjects' policy
	// maps and of the endpoints map (endpoints nil without the
	// `endpoints` table).
	subjects  *subjectPolicies
	endpoints *endpointWriter

	// fakeMaps, set by tests before start, are written instead of the
	// pinned maps; nothing is pinned or attached then.
	fakeMaps *writtenMaps

	// devices are the devices the program is attached to (devices.go).
	devices deviceAttachments
}

// writtenMaps are the maps the writers write.
type writtenMaps struct {
	ipcache, policy, enforcement mapwrite.Map
	// endpoints is the endpoints map; policies the outer policy map, whose
	// subjects' maps newPolicy makes and pinnedPolicies reads (nil in
	// fakes without subjects).
	endpoints, policies mapwrite.Map
	newPolicy           func() (innerPolicy, error)
	pinnedPolicies      func() (map[identity.Number]innerPolicy, error)
}

func newDatapath(cfg Config, log *slog.Logger) *Datapath {
	d := &Datapath{cfg: cfg, conntrack: bpfmaps.DefaultConntrackConfig(), log: log, stats: map[string]*mapwrite.Stats{
		bpfmaps.IPCacheName: {}, bpfmaps.PolicyName: {}, bpfmaps.EnforcementName: {}, bpfmaps.EndpointsName: {},
	}, snapshotTaken: make(chan struct{}), stream: newPinnedIPCacheStream()}
	return d
}

// Start implements cell.HookInterface: it mounts bpffs if needed, opens
// the pinned maps and attaches the enforcement program to the devices.
//
// Possible errors: those of bpfmaps.EnsureBPFFS; the pinned maps cannot be opened,
// migrated or replaced (a map too small for what it holds names the flag
// to raise); the program cannot be loaded or attached to a device.
func (d *Datapath) Start(cell.HookContext) error {
	if d.fakeMaps != nil {
		close(d.snapshotTaken) // empty: nothing was pinned
		d.stream.end(nil)
		return nil
	}
	// The program is parsed while the maps are opened: neither needs
	// the other, and both are most of the start.
	var spec func() (*ebpf.CollectionSpec, error)
	if d.loadsEnforcer() {
		spec = parseEnforcerAhead()
	}
	mounted, err := bpfmaps.EnsureBPFFS(d.cfg.BPFRoot)
	if err != nil {
		return err
	}
	if mounted {
		d.log.Info("Mounted bpffs", "bpf-root", d.cfg.BPFRoot)
	}
	opened, err := bpfmaps.Open(bpfmaps.PinDir(d.cfg.BPFRoot), bpfmaps.Sizes{
		IPCache: d.cfg.IPCacheMapMaxEntries, Policy: d.cfg.PolicyMapMaxEntries,
		Conntrack: d.conntrack.MapMaxEntries, ConntrackOpening: d.conntrack.OpeningMapMaxEntries,
	}, d.cfg.Devices, d.log)
	if err != nil {
		return err
	}
	revision, err := newRevisionCounter(opened.Revision)
	if err != nil {
		opened.Close()
		return err
	}
	d.log.Info("Pinned maps open", "dir", bpfmaps.PinDir(d.cfg.BPFRoot))
	d.mu.Lock()
	d.maps, d.revision = opened, revision
	d.mu.Unlock()
	if err := d.attachEnforcer(opened, spec); err != nil {
		return err
	}
	// After the program is replaced, so that what the old one stored
	// cannot count either.
	if err := revision.startAbove(opened.Conntrack, opened.ConntrackOpening); err != nil {
		return err
	}
	// Last, so that a start that fails leaves no read running. Nothing
	// writes the ipcache map before the read ends: its writer waits for
	// it (pinnedIPCache), and the program only reads the map.
	d.reading.Add(1)
	go func() {
		defer d.reading.Done()
		// The error is the stream's reader's to report: restore fails
		// its start with it (bpfmaps.PinnedIPCache); the map's writer
		// then reads the map itself.
		_ = d.readPinned(opened.IPCache)
	}()
	return nil
}

// readPinned reads the pinned ipcache map into the snapshot, giving each
// block to the stream as it is read, and ends the stream.
//
// Possible errors: the map cannot be read (wrapped).
func (d *Datapath) readPinned(m mapwrite.Map) error {
	snapshot, err := bpfmaps.ReadIPCacheMap(m, d.log, d.stream.publish)
	if err != nil {
		err = fmt.Errorf("read the pinned ipcache map in %s: %w", bpfmaps.PinDir(d.cfg.BPFRoot), err)
	} else {
		d.log.Info("Read the pinned ipcache map", "entries", len(snapshot.Entries),
			"unreadable-entries", len(snapshot.Unreadable))
	}
	d.mu.Lock()
	d.snapshot, d.snapshotErr = snapshot, err
	d.mu.Unlock()
	close(d.snapshotTaken)
	d.stream.end(err)
	return err
}

// loadsEnforcer says whether the start loads the program: there are
// --devices, or endpoints that need it.
func (d *Datapath) loadsEnforcer() bool {
	return len(d.cfg.Devices) > 0 || d.devices.loadsWithoutDevices()
}

// attachEnforcer loads the enforcement program over the pinned maps and
// attaches it to every selected device that exists (devices.go); on a
// restart this replaces the program in the pinned links in place. A
// listed device that is missing or not Ethernet is skipped: the
// attach-devices job attaches the program once it appears. parsed waits
// for the program's parse (parseEnforcerAhead), nil when loadsEnforcer is
// false.
func (d *Datapath) attachEnforcer(m *bpfmaps.Pinned, parsed func() (*ebpf.CollectionSpec, error)) error {
	if !d.loadsEnforcer() {
		d.log.Info("No --devices: not enforcing policy on any device")
		return nil
	}
	spec, err := parsed()
	if err != nil {
		return err
	}
	enf, err := loadEnforcerSpec(spec, enforcerMaps{IPCache: m.IPCache, Policies: m.Policies, Policy: m.Policy, Enforcement: m.Enforcement,
		Counters: m.Counters, Endpoints: m.Endpoints, Conntrack: m.Conntrack, ConntrackOpening: m.ConntrackOpening, Revision: m.Revision,
		DNSProxy: m.DNSProxy, DNSAnswers: m.DNSAnswers, DNSAnswersLost: m.DNSAnswersLost, ConntrackTimeouts: d.conntrack.Timeouts},
		ebpf.ProgramOptions{})
	if err != nil {
		return err
	}
	for _, device := range d.startDevices(newDeviceSelection(d.cfg.Devices)) {
		if err := d.attachAtStart(enf, device); err != nil {
			enf.Close()
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.enforcer = enf
	// The filter the endpoints writer set before, if any; without one
	// every slot is looked up (bits clear), right whatever the map holds.
	if err := d.tellEndpointFilterLocked(); err != nil {
		d.log.Warn("The program looks every endpoint address up", "error", err)
	}
	return nil
}

// Stop implements cell.HookInterface. The maps stay pinned: the datapath
// outlives the agent.
//
// Possible errors: the program's or the maps' descriptors cannot be closed.
func (d *Datapath) Stop(cell.HookContext) error {
	d.reading.Wait() // a read of the pinned map, which Start left running
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	if d.enforcer != nil {
		errs = append(errs, d.enforcer.Close())
		d.enforcer = nil
	}
	if d.maps != nil {
		errs = append(errs, d.maps.Close())
		d.maps = nil
	}
	errs = append(errs, d.revision.Close())
	d.revision = nil
	return errors.Join(errs...)
}

// pinnedIPCache returns what the pinned ipcache map held at start, kept
// over the snapshot of the read restore takes (mapwrite.NewSnapshotValues). The unreadable keys are
// in it, so that the first prune deletes them.
func (d *Datapath) pinnedIPCache() mapwrite.KnownValues[bpfmaps.IPCacheKey, bpfmaps.IPCacheValue] {
	<-d.snapshotTaken // before Start returns, or on the read's goroutine after
	d.mu.Lock()
	snapshot, err := d.snapshot, d.snapshotErr
	d.mu.Unlock()
	if err != nil {
		return nil // the writer reads the map itself
	}
	return mapwrite.NewSnapshotValues(snapshot)
}

// MapWrites returns how many keys the reconciler of the named map has
// written, and how many writes it skipped because the pinned map already
// held the value (after a restart).
func (d *Datapath) MapWrites(mapName string) (written, unchanged uint64) {
	if s, ok := d.stats[mapName]; ok {
		return s.Written.Load(), s.Unchanged.Load()
	}
	return 0, 0
}

// Prunes returns how many prunes of the named map its reconciler has
// completed: the first comes once the desired table is initialized.
func (d *Datapath) Prunes(mapName string) uint64 {
	if s, ok := d.stats[mapName]; ok {
		return s.Prunes.Load()
	}
	return 0
}

// IPCacheStatus returns whether the `ipcache` entry of table revision rev
// (what statedb's Get and iteration return with it) is in the ipcache map:
// Done if the writer wrote it (or its delete), Error with the error if its
// write failed and is retried, Pending if the writer has not got to it. The
// entries carry no status: the writer keeps it (ipcacheWriter).
func (d *Datapath) IPCacheStatus(rev statedb.Revision) (reconciler.StatusKind, error) {
	if d.ipcacheWriter == nil {
		return reconciler.StatusKindPending, nil
	}
	return d.ipcacheWriter.status(rev)
}

// Counters returns the enforcement program's verdict counts from the pinned
// counters map, summed over CPUs. They count only while the program is
// attached to a device (--devices).
//
// Possible errors: ErrMapsNotOpen before start or after stop; the
// kernel's error when the counters map cannot be read.
func (d *Datapath) Counters() (bpfmaps.Counters, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.maps == nil || d.maps.Counters == nil {
		return bpfmaps.Counters{}, fmt.Errorf("read counters: %w", ErrMapsNotOpen)
	}
	return bpfmaps.ReadCounters(d.maps.Counters)
}

func (d *Datapath) statsOf(mapName string) *mapwrite.Stats { return d.stats[mapName] }

// SetDNSProxyPort writes the DNS proxy's port to the pinned dns-proxy map:
// the program steers the DNS that policy entries of verdict 3
// (policy.VerdictDNSProxy) allow to the proxy's UDP and TCP sockets on
// that port, found in the calling process's network namespace as the
// program sees it. 0 steers nothing. Write it once the proxy listens:
// until then the program finds no socket and the queries go to their
// servers. The port stays in the pinned map when the agent stops; with the
// proxy's sockets gone the program finds none there, and the next agent
// writes its own. The host also needs the policy route of the mark
// (datapathcell/README.md, DNS proxy). With fake maps (tests) nothing is
// written.
//
// Possible errors: ErrMapsNotOpen before start or after stop; the map
// cannot be written.
func (d *Datapath) SetDNSProxyPort(port uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fakeMaps != nil {
		return nil
	}
	if d.maps == nil || d.maps.DNSProxy == nil {
		return fmt.Errorf("set the DNS proxy's port: %w", ErrMapsNotOpen)
	}
	if err := d.maps.DNSProxy.Put(uint32(0), bpfmaps.NewDNSProxyValue(port)); err != nil {
		return fmt.Errorf("set the DNS proxy's port in the %s map: %w", bpfmaps.DNSProxyName, err)
	}
	return nil
}

// DNSAnswers returns the pinned dns-answers ring buffer: the DNS answers
// over UDP that reached a local endpoint without passing through the DNS
// proxy while the dns-proxy map held a port (the agent down or
// restarting), one bpfmaps.DNSAnswerRecord each (bpfmaps.DecodeDNSAnswer).
// The ring keeps what nobody read, and its read position, across
// restarts: a reader at start reads what was answered while no agent ran.
// The map belongs to the datapath: read it (ringbuf.NewReader), do not
// close it; it is closed at stop. With fake maps (tests) there is none.
//
// Possible errors: ErrMapsNotOpen before start, after stop or with fake
// maps.
func (d *Datapath) DNSAnswers() (*ebpf.Map, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.maps == nil || d.maps.DNSAnswers == nil {
		return nil, fmt.Errorf("the DNS answers ring: %w", ErrMapsNotOpen)
	}
	return d.maps.DNSAnswers, nil
}

// DNSAnswersLost returns how many DNS answers the program could not record
// because the dns-answers ring was full, ever (the count is pinned).
//
// Possible errors: ErrMapsNotOpen before start, after stop or with fake
// maps; the map cannot be read.
func (d *Datapath) DNSAnswersLost() (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.maps == nil || d.maps.DNSAnswersLost == nil {
		return 0, fmt.Errorf("the DNS answers lost: %w", ErrMapsNotOpen)
	}
	return bpfmaps.ReadDNSAnswersLost(d.maps.DNSAnswersLost)
}

// setAnyIdentityEntries tells the attached program whether the policy map
// may hold identity-0 entries (policy_flags): while it holds none, the
// program skips that lookup. Without a program (no --devices, fake maps)
// there is nothing to tell.
//
// Possible errors: the program's variable cannot be written.
func (d *Datapath) setAnyIdentityEntries(present bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.enforcer == nil || d.enforcer.policyFlags == nil {
		return nil
	}
	var flags uint32
	if !present {
		flags = policyNoAnyIdentity
	}
	if err := d.enforcer.policyFlags.Set(flags); err != nil {
		return fmt.Errorf("set the program's policy_flags: %w", err)
	}
	return nil
}

// setEndpointFilter gives the program its endpoint_absent (f) and its
// endpoint_words (words), and keeps them for a program loaded later. The
// endpoints writer calls it before each round's writes and after its
// deletes (endpointWriter.round).
//
// Possible errors: the program's variables cannot be written.
func (d *Datapath) setEndpointFilter(f *endpointFilter, words endpointWords) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endpointFilter, d.endpointWords = f, words
	return d.tellEndpointFilterLocked()
}

// tellEndpointFilterLocked writes the kept endpoint filter and words to
// the program, if there are both.
func (d *Datapath) tellEndpointFilterLocked() error {
	if d.enforcer == nil || d.enforcer.endpointAbsent == nil || d.endpointFilter == nil {
		return nil
	}
	if err := d.enforcer.endpointAbsent.Set(d.endpointFilter); err != nil {
		return fmt.Errorf("set the program's endpoint_absent: %w", err)
	}
	return d.enforcer.setEndpointWords(d.endpointWords)
}

// written returns the maps the writers write, which run only between start
// and stop. Each write to them bumps the revision (revisedMap): this is
// the one place the writers get their maps from.
func (d *Datapath) written() writtenMaps {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fakeMaps != nil {
		return *d.fakeMaps
	}
	maps, revision, maxEntries := d.maps, d.revision, d.cfg.PolicyMapMaxEntries
	return writtenMaps{
		ipcache:     revisedMap{maps.IPCache, revision},
		policy:      revisedMap{maps.Policy, revision},
		enforcement: revisedMap{maps.Enforcement, revision},
		endpoints:   revisedMap{maps.Endpoints, revision},
		// Which map a subject's packets are looked up in is a change of
		// their policy too.
		policies: revisedMap{maps.Policies, revision},
		newPolicy: func() (innerPolicy, error) {
			m, err := ebpf.NewMap(bpfmaps.PolicySpec(maxEntries))
			if err != nil {
				return innerPolicy{}, fmt.Errorf("create a subject's policy map: %w", err)
			}
			return innerPolicy{write: revisedMap{m, revision}, handle: m, close: m.Close}, nil
		},
		pinnedPolicies: func() (map[identity.Number]innerPolicy, error) {
			return pinnedSubjectPolicies(maps.Policies, revision)
		},
	}
}

// pinnedSubjectPolicies opens the maps of the subjects other than 0 that
// the outer policy map holds.
//
// Possible errors: the outer map cannot be read, or a map opened.
func pinnedSubjectPolicies(outer *ebpf.Map, revision *revisionCounter) (map[identity.Number]innerPolicy, error) {
	var subjects []identity.Number
	var (
		key uint32
		id  uint32 // the inner map's ID, as the kernel answers a map of maps
	)
	it := outer.Iterate()
	for it.Next(&key, &id) {
		if key != 0 {
			subjects = append(subjects, identity.Number(key))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the outer %s map: %w", bpfmaps.PolicyName, err)
	}
	out := make(map[identity.Number]innerPolicy, len(subjects))
	for _, subject := range subjects {
		m, err := bpfmaps.PolicyOf(outer, subject)
		if err != nil {
			for _, inner := range out {
				inner.close()
			}
			return nil, err
		}
		out[subject] = innerPolicy{write: revisedMap{m, revision}, handle: m, close: m.Close}
	}
	return out, nil
}

func (d *Datapath) ipcacheMap() mapwrite.Map     { return d.written().ipcache }
func (d *Datapath) policyMap() mapwrite.Map      { return d.written().policy }
func (d *Datapath) enforcementMap() mapwrite.Map { return d.written().enforcement }

// lookupEndpoint returns the endpoints map's entry for addr.
//
// Possible errors: ErrMapsNotOpen; the lookup failed.
func (d *Datapath) lookupEndpoint(addr netip.Addr) (subject identity.Number, ifindex uint32, found bool, err error) {
	d.mu.Lock()
	var m mapwrite.Map
	switch {
	case d.fakeMaps != nil:
		m = d.fakeMaps.endpoints
	case d.maps != nil && d.maps.Endpoints != nil:
		m = d.maps.Endpoints
	}
	d.mu.Unlock()
	if m == nil {
		return 0, 0, false, fmt.Errorf("look up %s in the %s map: %w", addr, bpfmaps.EndpointsName, ErrMapsNotOpen)
	}
	k := bpfmaps.NewEndpointKey(addr)
	var v bpfmaps.EndpointValue
	if err := m.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, 0, false, nil
		}
		return 0, 0, false, fmt.Errorf("look up %s in the %s map: %w", addr, bpfmaps.EndpointsName, err)
	}
	return v.Identity(), v.Ifindex(), true, nil
}

// endpointsMap is the endpoints map the endpoints writer writes.
func (d *Datapath) endpointsMap() mapwrite.Map { return d.written().endpoints }

// policiesMap is the outer policy map.
func (d *Datapath) policiesMap() mapwrite.Map { return d.written().policies }

// newSubjectPolicy makes an empty policy map for a subject.
//
// Possible errors: ErrMapsNotOpen; the kernel's.
func (d *Datapath) newSubjectPolicy() (innerPolicy, error) {
	w := d.written()
	if w.newPolicy == nil {
		return innerPolicy{}, ErrMapsNotOpen
	}
	return w.newPolicy()
}

// pinnedSubjectPolicies returns the subjects' policy maps the outer map
// holds from a previous run.
//
// Possible errors: the outer map cannot be read.
func (d *Datapath) pinnedSubjectPolicies() (map[identity.Number]innerPolicy, error) {
	w := d.written()
	if w.pinnedPolicies == nil {
		return nil, nil
	}
	return w.pinnedPolicies()
}

// WaitEnforced implements endpoint.Enforcement: see endpointWriter. Without
// the `endpoints` table there is nothing to wait for.
func (d *Datapath) WaitEnforced(ctx context.Context, id string, rev statedb.Revision) error {
	if d.endpoints == nil {
		return nil
	}
	return d.endpoints.WaitEnforced(ctx, id, rev)
}
