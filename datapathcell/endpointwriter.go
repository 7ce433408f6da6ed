// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
	"github.com/ipcache-agent/ipcache-agent/devicecell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// subjectUses is what points at each subject (a local endpoint's
// identity) in the maps: the endpoints map's entries, which the
// endpoints writer counts, and the enforcement map's entries, which the
// enforcement writer records. A subject's enforcement and policy map go
// only once no endpoints entry points at it, in that order.
type subjectUses struct {
	mu sync.Mutex
	// endpoints counts the endpoints map's entries by identity; read is
	// set once the map was read at start (before, nothing is released).
	endpoints map[identity.Number]int
	read      bool
	// enforcement are the enforcement map's values of the subjects other
	// than 0 that are not 0 (an array: a subject nobody wrote is 0, not
	// enforced).
	enforcement map[bpfmaps.EnforcementKey]bpfmaps.EnforcementValue
	// changed is closed and replaced at every change.
	changed chan struct{}
}

func newSubjectUses() *subjectUses {
	return &subjectUses{
		endpoints:   map[identity.Number]int{},
		enforcement: map[bpfmaps.EnforcementKey]bpfmaps.EnforcementValue{},
		changed:     make(chan struct{}),
	}
}

func (u *subjectUses) notifyLocked() {
	close(u.changed)
	u.changed = make(chan struct{})
}

// users returns how many endpoints map entries point at id.
func (u *subjectUses) users(id identity.Number) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.endpoints[id]
}

// known reports whether the endpoints map's entries are known (read at
// start, or there is no endpoints writer).
func (u *subjectUses) known() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.read
}

// setEndpoints sets the endpoints map's entries by identity (at start).
func (u *subjectUses) setEndpoints(counts map[identity.Number]int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.endpoints, u.read = counts, true
	u.notifyLocked()
}

// endpointMoved records an endpoints map entry that pointed at from (0:
// none) and points at to (0: deleted).
func (u *subjectUses) endpointMoved(from, to identity.Number) {
	if from == to {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if from != identity.Unknown {
		if u.endpoints[from]--; u.endpoints[from] <= 0 {
			delete(u.endpoints, from)
		}
	}
	if to != identity.Unknown {
		u.endpoints[to]++
	}
	u.notifyLocked()
}

// enforced reports whether the enforcement map has an entry of id.
func (u *subjectUses) enforced(id identity.Number) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k := range u.enforcement {
		if k.Subject() == id {
			return true
		}
	}
	return false
}

// enforcementValue returns the enforcement map's value for a subject's
// direction (found false: no entry, not enforced).
func (u *subjectUses) enforcementValue(k bpfmaps.EnforcementKey) (bpfmaps.EnforcementValue, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	v, ok := u.enforcement[k]
	return v, ok
}

// setEnforcement records the enforcement map's value for k. Subject 0's
// are not kept.
func (u *subjectUses) setEnforcement(k bpfmaps.EnforcementKey, v bpfmaps.EnforcementValue) {
	if k.Subject() == identity.Unknown {
		return
	}
	present := v != bpfmaps.EnforceNone
	u.mu.Lock()
	defer u.mu.Unlock()
	if old, ok := u.enforcement[k]; ok == present && old == v {
		return
	}
	if present {
		u.enforcement[k] = v
	} else {
		delete(u.enforcement, k)
	}
	u.notifyLocked()
}

// wait returns a channel closed at the next change.
func (u *subjectUses) wait() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.changed
}

// endpointWriter writes the local endpoints of the `endpoints` table into
// the endpoints map, in the order make before break needs
// (datapathcell/README.md, "Make before break"): an address's entry is
// written, or switched to a new identity, only once its subject's policy
// entries and enforcement entries, as the selectors computed them for the
// tables the entry is read with, are in the kernel; until then the map
// keeps what it has for the address (nothing, or the old identity, whose
// policy stays until no entry points at it). An entry that goes is
// deleted first; its subject's enforcement and policy map go after.
//
// It publishes, per endpoint, the revision of its row that is in the maps
// (endpoint.Enforcement). Endpoints are few (thousands, not the ipcache's
// millions): each round compares every local row with the map.
type endpointWriter struct {
	db          *statedb.DB
	table       statedb.Table[*endpoint.State]
	enforcement statedb.Table[*policy.Enforcement]
	target      func() mapwrite.Map
	order       *ordering
	subjects    *subjectPolicies
	stats       *mapwrite.Stats
	log         *slog.Logger
	// filter, if set, gives the program the slots that hold no address
	// (endpointFilter) and the words of the IPv4 addresses
	// (endpointWords): before a round writes, and after it deleted.
	filter func(*endpointFilter, endpointWords) error

	// inMap is what the map holds of addresses; the run goroutine's.
	inMap map[bpfmaps.EndpointKey]bpfmaps.EndpointValue
	// devicesInMap are the devices the map says endpoints are bound to
	// (bpfmaps.NewEndpointDeviceKey); the run goroutine's.
	devicesInMap map[uint32]struct{}

	mu sync.Mutex
	// ifindex resolves an endpoint's device: in the devices table
	// (followDevices), else net.InterfaceByName's index (tests replace
	// it: setIfindex); a device that is missing holds the endpoint's
	// entries back, retried every retry.
	ifindex func(name string) (uint32, error)
	// devices, when set, is watched: a device that appears or comes back
	// under a new ifindex is written again at once (followDevices).
	devices statedb.Table[*devicecell.Device]
	retry   time.Duration
	// rows are, by endpoint ID, the revision of its row last written, or
	// the error that holds it back.
	rows map[string]rowWritten
	// seen is the table revision of the last round: a row not in rows was
	// not in the table then.
	seen       statedb.Revision
	progressed chan struct{}
}

// rowWritten is the revision of an endpoint's row the writer got to, and
// the error that holds its entries back (nil: they are in the map);
// pending: its entries wait for its subject's enforcement entries.
type rowWritten struct {
	rev     statedb.Revision
	err     error
	pending bool
}

var _ endpoint.Enforcement = (*endpointWriter)(nil)

// errEnforcementPending holds an endpoint back until its subject's
// enforcement entries are written.
var errEnforcementPending = errors.New("waiting for the enforcement entries of its identity")

func newEndpointWriter(db *statedb.DB, table statedb.Table[*endpoint.State], enforcement statedb.Table[*policy.Enforcement],
	target func() mapwrite.Map, order *ordering, subjects *subjectPolicies, stats *mapwrite.Stats, log *slog.Logger) *endpointWriter {
	return &endpointWriter{
		db: db, table: table, enforcement: enforcement, target: target, order: order, subjects: subjects, stats: stats, log: log,
		ifindex:    interfaceIndex,
		retry:      time.Second,
		rows:       map[string]rowWritten{},
		progressed: make(chan struct{}),
	}
}

// interfaceIndex is a device's ifindex by name, "" any device (0).
func interfaceIndex(name string) (uint32, error) {
	if name == "" {
		return 0, nil
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrDeviceNotFound, name, err)
	}
	return uint32(ifc.Index), nil
}

func (w *endpointWriter) retryInterval() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.retry
}

// followDevices resolves devices in the devices table, and has every
// change of it start a round: an endpoint's device deleted and created
// again under its name gets its new ifindex in the endpoints map (else
// its traffic would be another device's: spoofed).
func (w *endpointWriter) followDevices(devices statedb.Table[*devicecell.Device]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.devices = devices
	w.ifindex = func(name string) (uint32, error) {
		if name == "" {
			return 0, nil
		}
		d, _, found := devices.Get(w.db.ReadTxn(), devicecell.NameIndex.Query(name))
		if !found {
			return 0, fmt.Errorf("%w: %s", ErrDeviceNotFound, name)
		}
		return uint32(d.Index), nil
	}
}

// setIfindex replaces how devices are resolved.
func (w *endpointWriter) setIfindex(resolve func(name string) (uint32, error)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ifindex = resolve
}

// WaitEnforced implements endpoint.Enforcement.
func (w *endpointWriter) WaitEnforced(ctx context.Context, id string, rev statedb.Revision) error {
	for {
		w.mu.Lock()
		row, ok := w.rows[id]
		seen, progressed := w.seen, w.progressed
		w.mu.Unlock()
		switch {
		case ok && row.pending:
		case ok && row.rev >= rev && row.err != nil:
			return fmt.Errorf("endpoint %s: %w", id, row.err)
		case ok && row.rev >= rev:
			return nil
		case !ok && seen >= rev:
			return nil // deleted
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-progressed:
		}
	}
}

// readMap reads what the map holds (a previous run's entries) and tells
// the subjects' users.
func (w *endpointWriter) readMap() error {
	inMap := map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{}
	devices := map[uint32]struct{}{}
	err := bpfmaps.ReadEntries(w.target(), func(k bpfmaps.EndpointKey, v bpfmaps.EndpointValue) {
		if ifindex, ok := k.Device(); ok {
			devices[ifindex] = struct{}{}
			return
		}
		inMap[k] = v
	})
	if err != nil {
		return fmt.Errorf("read the %s map: %w", bpfmaps.EndpointsName, err)
	}
	counts := map[identity.Number]int{}
	for _, v := range inMap {
		counts[v.Identity()]++
	}
	w.inMap, w.devicesInMap = inMap, devices
	w.order.uses.setEndpoints(counts)
	return nil
}

// run is the writer's job.
func (w *endpointWriter) run(ctx context.Context, health cell.Health) error {
	for w.inMap == nil {
		if err := w.readMap(); err != nil {
			health.Degraded("Cannot read the endpoints map", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(w.retryInterval()):
			}
		}
	}
	w.mu.Lock()
	devices := w.devices
	w.mu.Unlock()
	if devices != nil {
		// Until the devices are listed every device would be missing.
		if init, watch := devices.Initialized(w.db.ReadTxn()); !init {
			select {
			case <-ctx.Done():
				return nil
			case <-watch:
			}
		}
	}
	for {
		txn := w.db.ReadTxn()
		rows, watch := w.table.AllWatch(txn)
		initialized, initWatch := w.table.Initialized(txn)
		// The selectors have computed the policy tables for the endpoints
		// (and policies and identities) as txn has them, and the policy
		// writer has written those entries.
		computed, err := w.order.selectors.WaitComputed(ctx, txn)
		if err != nil {
			return nil
		}
		if _, _, err := w.order.policyWriter.WaitUntilReconciled(ctx, computed.Entries); err != nil {
			return nil
		}
		// After the wait: the enforcement rows computed for txn are in it.
		rowsTxn := w.db.ReadTxn()
		usesChanged := w.order.uses.wait()
		var devicesChanged <-chan struct{}
		w.mu.Lock()
		if w.devices != nil {
			_, devicesChanged = w.devices.AllWatch(rowsTxn)
		}
		w.mu.Unlock()
		// The rows are txn's: an endpoint written after it is not among
		// them, so the round has seen the table as of txn, not rowsTxn
		// (WaitEnforced would take it for deleted).
		errs, held := w.round(rowsTxn, rows, w.table.Revision(txn), initialized)
		w.report(health, errs, held)

		var retry <-chan time.Time
		if held > 0 {
			retry = time.After(w.retryInterval())
		}
		if initialized {
			initWatch = nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-initWatch:
		case <-retry:
		case <-usesChanged:
		case <-devicesChanged:
		}
	}
}

// round writes the map as rows say, and publishes each row's revision and
// seen, the table's revision the rows are of. It returns the errors of the
// endpoints held back, and how many are.
func (w *endpointWriter) round(txn statedb.ReadTxn, rows iter.Seq2[*endpoint.State, statedb.Revision], seen statedb.Revision, initialized bool) (errs []error, held int) {
	desired := map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{}
	owner := map[bpfmaps.EndpointKey]string{}
	written := map[string]rowWritten{}
	w.mu.Lock()
	resolve := w.ifindex
	w.mu.Unlock()
	for row, rev := range rows {
		id := row.ID()
		switch {
		case !row.Local:
			// Another node's: nothing of it is in this node's map.
			written[id] = rowWritten{rev: rev}
			continue
		case row.Identity == identity.Unknown:
			// No identity yet: the endpoint cell writes it again.
			written[id] = rowWritten{pending: true}
			continue
		}
		ifindex, err := resolve(row.Interface)
		if err == nil {
			err = w.enforcementReady(txn, row.Identity)
		}
		if err == nil {
			err = w.subjects.use(row.Identity)
		}
		if errors.Is(err, errEnforcementPending) {
			// Not written yet, and no error: WaitEnforced waits on.
			written[id] = rowWritten{pending: true}
		} else {
			written[id] = rowWritten{rev: rev, err: err}
		}
		for _, addr := range row.Addresses {
			k := bpfmaps.NewEndpointKey(addr)
			owner[k] = id
			if err != nil {
				// The map keeps what it has for the address: nothing, or
				// the previous identity, whose policy stays meanwhile.
				if v, ok := w.inMap[k]; ok {
					desired[k] = v
				}
				continue
			}
			desired[k] = bpfmaps.NewEndpointValue(row.Identity, ifindex)
		}
	}
	// The program looks up every slot of an address or device written
	// below before it is: one it skipped would make the address the
	// default's, or the device one without endpoints. It reads no word
	// of an address whose entry changes or goes: only those that stay.
	if w.filter != nil {
		unchanged := map[bpfmaps.EndpointKey]bpfmaps.EndpointValue{}
		for k, v := range desired {
			if old, ok := w.inMap[k]; ok && old == v {
				unchanged[k] = v
			}
		}
		if err := w.filter(absentExcept(maps.Keys(w.inMap), maps.Keys(desired), deviceKeys(w.devicesInMap, w.inMap, desired)),
			endpointWordsOf(unchanged, maps.Keys(w.inMap), maps.Keys(desired))); err != nil {
			// Nothing is written: every row waits for the next round.
			for id, r := range written {
				if r.err == nil && !r.pending {
					written[id] = rowWritten{rev: r.rev, err: err}
				}
			}
			return w.publish(seen, written, nil, 0)
		}
	}
	// Writes first, then deletes: an address that moves between two
	// endpoints is overwritten, never missing in between.
	for k, v := range desired {
		old, had := w.inMap[k]
		if had && old == v {
			continue
		}
		if err := w.target().Put(&k, &v); err != nil {
			id := owner[k]
			written[id] = rowWritten{rev: written[id].rev, err: fmt.Errorf("write the %s map: %w", bpfmaps.EndpointsName, err)}
			held++
			continue
		}
		w.stats.Written.Add(1)
		w.inMap[k] = v
		w.order.uses.endpointMoved(old.Identity(), v.Identity())
	}
	// The devices the addresses are bound to: after their addresses (an
	// endpoint's own traffic is never taken for spoofed), and gone before
	// them.
	devices := map[uint32]struct{}{}
	for _, v := range w.inMap {
		if v.Ifindex() != 0 {
			devices[v.Ifindex()] = struct{}{}
		}
	}
	for ifindex := range devices {
		if _, ok := w.devicesInMap[ifindex]; ok {
			continue
		}
		k, v := bpfmaps.NewEndpointDeviceKey(ifindex), bpfmaps.NewEndpointValue(identity.Unknown, ifindex)
		if err := w.target().Put(&k, &v); err != nil {
			errs = append(errs, fmt.Errorf("write device %d to the %s map: %w", ifindex, bpfmaps.EndpointsName, err))
			held++
			continue
		}
		w.stats.Written.Add(1)
		w.devicesInMap[ifindex] = struct{}{}
	}
	// Before the table is initialized, the endpoints of the previous run
	// that no source registered again yet stay.
	if initialized {
		stillBound := map[uint32]struct{}{}
		for k, v := range w.inMap {
			if _, ok := desired[k]; ok && v.Ifindex() != 0 {
				stillBound[v.Ifindex()] = struct{}{}
			}
		}
		for ifindex := range w.devicesInMap {
			if _, ok := stillBound[ifindex]; ok {
				continue
			}
			k := bpfmaps.NewEndpointDeviceKey(ifindex)
			if err := w.target().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete device %d from the %s map: %w", ifindex, bpfmaps.EndpointsName, err))
				held++
				continue
			}
			w.stats.Written.Add(1)
			delete(w.devicesInMap, ifindex)
		}
		for k, v := range w.inMap {
			if _, ok := desired[k]; ok {
				continue
			}
			if err := w.target().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete from the %s map: %w", bpfmaps.EndpointsName, err))
				held++
				continue
			}
			w.stats.Written.Add(1)
			delete(w.inMap, k)
			w.order.uses.endpointMoved(v.Identity(), identity.Unknown)
		}
	}
	// The slots whose last address or device went are skipped from now
	// on, and the addresses written are read from their words. Before
	// the subjects go: a word points at its subject as the entry does.
	if w.filter != nil {
		if err := w.filter(absentExcept(maps.Keys(w.inMap), deviceKeys(w.devicesInMap)), endpointWordsOf(w.inMap)); err != nil {
			errs = append(errs, err)
			held++
		}
	}
	// A subject no entry points at any more may go.
	w.subjects.drainRound()
	return w.publish(seen, written, errs, held)
}

// publish counts the held rows' errors in errs and held, and publishes
// each row's revision and seen, the table's revision the rows are of: a
// row not among them with a revision up to seen is deleted.
func (w *endpointWriter) publish(seen statedb.Revision, written map[string]rowWritten, errs []error, held int) ([]error, int) {
	for _, r := range written {
		if r.err != nil || r.pending {
			held++
		}
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	w.mu.Lock()
	w.rows, w.seen = written, seen
	close(w.progressed)
	w.progressed = make(chan struct{})
	w.mu.Unlock()
	return errs, held
}

// enforcementReady returns nil once the enforcement map holds what the
// `policy-enforcement` rows of subject say, as txn has them.
func (w *endpointWriter) enforcementReady(txn statedb.ReadTxn, subject identity.Number) error {
	for _, dir := range policy.Directions() {
		row, _, found := w.enforcement.Get(txn, policy.EnforcementIndex.Query(policy.EnforcementKey{Subject: subject, Direction: dir}))
		want := bpfmaps.EnforceNone
		if found {
			want = enforcementOf(row)
		}
		// Dropping everything (a deny without room: subjectPolicies.failClosed) is more than any row asks.
		if v, _ := w.order.uses.enforcementValue(bpfmaps.NewEnforcementKey(subject, dir)); v != want && v != bpfmaps.EnforceDropAll {
			return errEnforcementPending
		}
	}
	return nil
}

func (w *endpointWriter) report(health cell.Health, errs []error, held int) {
	if len(errs) > 0 {
		health.Degraded(fmt.Sprintf("%d endpoint(s) held back", held), joinSome(errs, 10))
		return
	}
	health.OK(fmt.Sprintf("OK, %d address(es)", len(w.inMap)))
}
