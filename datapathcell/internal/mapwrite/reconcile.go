// SPDX-License-Identifier: Apache-2.0

package mapwrite

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

// Map is what the map writers use of a BPF map: an *ebpf.Map, or in
// tests a fake that records the order of writes across maps.
type Map interface {
	Put(key, value any) error
	Lookup(key, valueOut any) error
	Delete(key any) error
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	BatchLookup(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, opts *ebpf.BatchOptions) (int, error)
	Iterate() *ebpf.MapIterator
	MaxEntries() uint32
}

var _ Map = (*ebpf.Map)(nil)

// Ops reconciles a statedb table into a BPF map: each object is one
// key/value. It implements the reconciler's per-object and batch
// operations; batches fall back to per-key writes when the kernel has no
// batch operations for the map type.
//
// After a restart the pinned map already holds most of what the table will
// ask for. Until the first prune (which comes once the desired table is
// initialized), a write whose value the map already holds is skipped: the
// map's content is read once, before the first write, and the values of
// those keys are kept up to date with what this reconciler writes (nothing
// else writes the map). A restart then costs no map writes for entries
// that did not change, even when an entry is reconciled several times
// while its owners re-assert it (its source changes from restored to its
// owner's, its value does not). Keys the map did not hold are not added:
// at a first start over an empty map there is nothing to skip, and a copy
// of every written key costs CPU (docs/SCALE.md). After the first prune
// the copy is dropped: from then on the table changes only when the
// desired value does.
//
// Its methods are called from one goroutine at a time: the reconciler's
// (and, for the policy map, the drain's under policyOps' lock). The
// fields are set before the first call and not changed after.
type Ops[Obj any, K comparable, V comparable] struct {
	Name   string
	Target func() Map // set once the maps are open (start hook)
	Key    func(Obj) K
	Value  func(Obj) V

	// Gate, if set, is called before the map is written: it waits until
	// what must be in the other maps first is there (make before break;
	// see the datapath's ordering).
	Gate func(ctx context.Context, txn statedb.ReadTxn) error
	// Hold, if set, says why a value must not be written yet; the key
	// keeps what the map has.
	Hold func(V) error
	// Fallbacks, if set, yields the keys that take k's lookups once k is
	// deleted (for an LPM trie: the longest prefix strictly containing
	// k's, and the prefixes inside k's), the value each must have, and
	// whether the map may not have it yet. Those are written before k
	// goes; k stays while one of their values is held.
	Fallbacks func(txn statedb.ReadTxn, k K, yield func(fk K, fv V, pending bool))
	// Failed and Written, if set, are told of each key whose write failed
	// (or was held) and of each key written or deleted.
	Failed, Written func(K)

	// WriteOrder, if set, is the order in which a batch's keys are
	// written: the LPM trie inserts keys in address order several times
	// faster than in random order.
	WriteOrder func(a, b K) int

	// noBatch is set once the kernel said the map has no batch operations.
	noBatch bool

	// ReadPinned, if set, returns what the map holds before the first
	// write, known without reading it (the ipcache map's snapshot, taken
	// at start); otherwise skipUnchanged reads the map.
	ReadPinned func() KnownValues[K, V]
	// pinned is what the map held before the first write, with the values
	// written since to those keys, until the first prune; nil until read,
	// and after. The map holds no other key than these and those of
	// objects written (or deleted) by this reconciler.
	pinned KnownValues[K, V]
	// pruned is set by the first prune: pinned is no longer kept.
	pruned bool

	// Log, if set, says once when the map becomes full (the first key
	// that does not fit) and once when it has room again (every such key
	// written or gone): a full map retries thousands of keys, and a line
	// per retry would drown the log while saying nothing new.
	Log *slog.Logger
	// noRoom are the keys whose last write failed for lack of room and
	// that were not written or deleted since; Stats.NoRoom counts them.
	noRoom map[K]struct{}

	Stats *Stats
}

// Stats counts a reconciler's writes to its map.
type Stats struct {
	// Written counts keys written (updated or deleted).
	Written atomic.Uint64
	// Unchanged counts writes skipped because the map already held the
	// value (after a restart).
	Unchanged atomic.Uint64
	// Prunes counts completed prunes of the map.
	Prunes atomic.Uint64
	// NoRoom counts the keys that are not in the map because it was full
	// when they were last written (they are retried). Written only by the
	// map's writer; the writer reads it to skip a lookup on every write
	// while the map has room, which is almost always.
	NoRoom atomic.Int64
}

// skipUnchanged drops from batch the objects whose value the map already
// holds, and records the others' values as written (they are about to be).
// It does nothing after the first prune.
func (o *Ops[Obj, K, V]) skipUnchanged(keys []K, values []V) ([]K, []V) {
	if o.pruned {
		return keys, values
	}
	if o.pinned == nil && o.ReadPinned != nil {
		o.pinned = o.ReadPinned()
	}
	if o.pinned == nil {
		read := mapValues[K, V]{}
		if err := bpfmaps.ReadEntries(o.Target(), func(k K, v V) { read[k] = v }); err != nil {
			read = mapValues[K, V]{} // unknown: write everything
		}
		o.pinned = read
	}
	n := 0
	for i := range keys {
		old, known := o.pinned.get(keys[i])
		if known && old == values[i] {
			o.Stats.Unchanged.Add(1)
			continue
		}
		// Recorded before the write: should the write fail, the entry is
		// retried, and a retry must not be skipped, so forget on failure
		// (see failedWrite).
		if known {
			o.pinned.set(keys[i], values[i])
		}
		keys[n], values[n] = keys[i], values[i]
		n++
	}
	return keys[:n], values[:n]
}

// failedWrite forgets what skipUnchanged recorded for a key whose write
// failed: the map's value for it is unknown.
func (o *Ops[Obj, K, V]) failedWrite(k K) {
	if o.pinned != nil {
		o.pinned.forget(k)
	}
	if o.Failed != nil {
		o.Failed(k)
	}
}

// wrote counts a key written.
func (o *Ops[Obj, K, V]) wrote(k K) {
	o.Stats.Written.Add(1)
	if o.Stats.NoRoom.Load() != 0 {
		o.roomFor(k)
	}
	if o.Written != nil {
		o.Written(k)
	}
}

// noRoomFor records that k did not fit, and logs the map becoming full.
func (o *Ops[Obj, K, V]) noRoomFor(k K, err error) {
	if o.noRoom == nil {
		o.noRoom = map[K]struct{}{}
	}
	if _, ok := o.noRoom[k]; ok {
		return
	}
	o.noRoom[k] = struct{}{}
	if o.Stats.NoRoom.Add(1) == 1 && o.Log != nil {
		o.Log.Warn(fmt.Sprintf("The %s map is full: the entries that do not fit are not written, and retried (%s says which)", o.Name, o.whichFailed()),
			"map", o.Name, "max-entries", o.Target().MaxEntries(), "flag", "--"+o.Name+"-map-max-entries", "error", err)
	}
}

// whichFailed names the shell command that lists the entries not written
// and why: the ipcache map's writer keeps the status out of the rows.
func (o *Ops[Obj, K, V]) whichFailed() string {
	if o.Name == bpfmaps.IPCacheName {
		return "datapath/ipcache-status"
	}
	return "db/show " + o.Name
}

// roomFor records that k, if it did not fit before, is written or gone,
// and logs the map having room again once no key is left out.
func (o *Ops[Obj, K, V]) roomFor(k K) {
	if _, ok := o.noRoom[k]; !ok {
		return
	}
	delete(o.noRoom, k)
	if o.Stats.NoRoom.Add(-1) == 0 && o.Log != nil {
		o.Log.Info(fmt.Sprintf("The %s map has room again: every entry that did not fit is written or no longer wanted", o.Name),
			"map", o.Name)
	}
}

// forget marks keys as deleted (or pruned).
func (o *Ops[Obj, K, V]) forget(k K) {
	if o.pinned != nil {
		o.pinned.forget(k)
	}
	o.wrote(k)
}

// ForgetValue makes k's value unknown to the skip of unchanged writes:
// something other than Ops wrote k, so its next write must not be skipped.
func (o *Ops[Obj, K, V]) ForgetValue(k K) {
	if o.pinned != nil {
		o.pinned.forget(k)
	}
}

// waitGate waits for the gate, if any.
func (o *Ops[Obj, K, V]) waitGate(ctx context.Context, txn statedb.ReadTxn) error {
	if o.Gate == nil {
		return nil
	}
	if err := o.Gate(ctx, txn); err != nil {
		return fmt.Errorf("wait for the maps the %s map depends on: %w", o.Name, err)
	}
	return nil
}

// beforeDelete waits for the gate and writes what the keys' lookups fall
// back to once they are gone (see fallbacks), so that a key that goes
// never leaves its lookups to a fallback not yet written. It returns the
// keys that must stay, with why: a fallback's value is held.
func (o *Ops[Obj, K, V]) beforeDelete(ctx context.Context, txn statedb.ReadTxn, keys []K) (map[K]error, error) {
	if err := o.waitGate(ctx, txn); err != nil || o.Fallbacks == nil {
		return nil, err
	}
	var (
		stay   map[K]error
		seen   = map[K]struct{}{}
		first  []K
		values []V
	)
	for _, k := range keys {
		o.Fallbacks(txn, k, func(fk K, fv V, pending bool) {
			if err := o.held(fv); err != nil {
				if stay == nil {
					stay = map[K]error{}
				}
				stay[k] = err
				return
			}
			if _, dup := seen[fk]; pending && !dup {
				seen[fk] = struct{}{}
				first, values = append(first, fk), append(values, fv)
			}
		})
		if stay[k] != nil {
			o.failedWrite(k)
		}
	}
	for i := range first {
		if o.pinned != nil {
			o.pinned.set(first[i], values[i])
		}
		// A failure is the fallback's own to retry.
		_ = o.put(first[i], values[i])
	}
	return stay, nil
}

// held returns why v must not be written yet, or nil.
func (o *Ops[Obj, K, V]) held(v V) error {
	if o.Hold == nil {
		return nil
	}
	return o.Hold(v)
}

var (
	_ reconciler.Operations[any]      = (*Ops[any, int, int])(nil)
	_ reconciler.BatchOperations[any] = (*Ops[any, int, int])(nil)
)

// Update implements reconciler.Operations.
func (o *Ops[Obj, K, V]) Update(ctx context.Context, txn statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	keys, values := o.skipUnchanged([]K{o.Key(obj)}, []V{o.Value(obj)})
	if len(keys) == 0 {
		return nil
	}
	err := o.waitGate(ctx, txn)
	if err == nil {
		err = o.held(values[0])
	}
	if err != nil {
		o.failedWrite(keys[0])
		return err
	}
	return o.put(keys[0], values[0])
}

func (o *Ops[Obj, K, V]) put(k K, v V) error {
	if err := o.Target().Put(&k, &v); err != nil {
		o.failedWrite(k)
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
			// What the kernel says of a full map (ENOSPC for an LPM trie,
			// E2BIG for a hash map) does not say so.
			err = fmt.Errorf("update %s map: it is full (max entries %d; raise --%s-map-max-entries): %w",
				o.Name, o.Target().MaxEntries(), o.Name, err)
			o.noRoomFor(k, err)
			return err
		}
		return fmt.Errorf("update %s map: %w", o.Name, err)
	}
	o.wrote(k)
	return nil
}

// Delete implements reconciler.Operations. Deleting a key the map does not
// have is not an error.
func (o *Ops[Obj, K, V]) Delete(ctx context.Context, txn statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	k := o.Key(obj)
	stay, err := o.beforeDelete(ctx, txn, []K{k})
	if err != nil {
		return err
	}
	if err := stay[k]; err != nil {
		return err
	}
	return o.deleteKey(k)
}

func (o *Ops[Obj, K, V]) deleteKey(k K) error {
	if err := o.Target().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s map: %w", o.Name, err)
	}
	o.forget(k)
	return nil
}

// Prune implements reconciler.Operations: it deletes every key of the map
// that no object has. The reconciler calls it only once the table is
// initialized, i.e. every producer of desired state has spoken.
func (o *Ops[Obj, K, V]) Prune(ctx context.Context, txn statedb.ReadTxn, objects iter.Seq2[Obj, statedb.Revision]) error {
	stale, err := o.StaleKeys(objects)
	if err != nil {
		return err
	}
	if len(stale) > 0 {
		stay, err := o.beforeDelete(ctx, txn, stale)
		if err != nil {
			return err
		}
		// A stale key that must stay goes at a later prune.
		stale = slices.DeleteFunc(stale, func(k K) bool { return stay[k] != nil })
	}
	if err := o.DeleteKeys(stale); err != nil {
		return fmt.Errorf("prune %d stale keys of %s map: %w", len(stale), o.Name, err)
	}
	o.Stats.Prunes.Add(1)
	return nil
}

// StaleKeys returns the keys of the map that no object has, and ends the
// skip of unchanged writes: it is the first half of Prune, for a caller
// that deletes the keys itself.
//
// Possible errors: the map cannot be read (wrapped).
//
// Until the first prune, the map holds pinned's keys and those of the
// objects this reconciler wrote; a written key whose object went was
// deleted by Delete. So the first prune finds the stale keys among
// pinned's, without reading the map again (a read of a large map is
// time in which the reconciler writes nothing). Later prunes read the map.
func (o *Ops[Obj, K, V]) StaleKeys(objects iter.Seq2[Obj, statedb.Revision]) ([]K, error) {
	pinned := o.pinned
	o.pruned, o.pinned = true, nil
	var stale []K
	if pinned != nil {
		// pinned is dropped now: what is left of it once the desired
		// keys are taken out is what no object has.
		for obj := range objects {
			pinned.forget(o.Key(obj))
		}
		return pinned.known(), nil
	}
	desired := map[K]struct{}{}
	for obj := range objects {
		desired[o.Key(obj)] = struct{}{}
	}
	// Collect first: deleting while iterating can make the kernel's
	// iteration restart or skip keys.
	err := bpfmaps.ReadEntries(o.Target(), func(k K, _ V) {
		if _, ok := desired[k]; !ok {
			stale = append(stale, k)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read %s map to prune it: %w", o.Name, err)
	}
	return stale, nil
}

// DeleteKeys deletes keys from the map; keys it does not have are no error.
//
// Possible errors: the kernel's, one per key it did not delete (joined).
func (o *Ops[Obj, K, V]) DeleteKeys(keys []K) error {
	var errs []error
	for _, k := range keys {
		if err := o.Target().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
			continue
		}
		o.forget(k)
	}
	return errors.Join(errs...)
}

// UpdateBatch implements reconciler.BatchOperations. On a partial failure
// the entries the kernel did not take are retried one by one, so that each
// object's status says exactly whether it is in the map.
func (o *Ops[Obj, K, V]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	if o.noBatch {
		for i := range batch {
			batch[i].Result = o.Update(ctx, txn, batch[i].Revision, batch[i].Object)
		}
		return
	}
	keys := make([]K, len(batch))
	values := make([]V, len(batch))
	for i := range batch {
		keys[i], values[i] = o.Key(batch[i].Object), o.Value(batch[i].Object)
	}
	keys, values = o.skipUnchanged(keys, values)
	if len(keys) == 0 {
		return
	}
	// The result of each object is that of its key.
	failed := map[K]error{}
	defer func() {
		if len(failed) > 0 {
			for i := range batch {
				batch[i].Result = failed[o.Key(batch[i].Object)]
			}
		}
	}()
	if err := o.waitGate(ctx, txn); err != nil {
		for _, k := range keys {
			o.failedWrite(k)
			failed[k] = err
		}
		return
	}
	if o.Hold != nil {
		n := 0
		for i := range keys {
			if err := o.Hold(values[i]); err != nil {
				o.failedWrite(keys[i])
				failed[keys[i]] = err
				continue
			}
			keys[n], values[n] = keys[i], values[i]
			n++
		}
		keys, values = keys[:n], values[:n]
	}
	if o.WriteOrder != nil {
		sortTogether(keys, values, o.WriteOrder)
	}
	n, err := o.Target().BatchUpdate(keys, values, nil)
	for _, k := range keys[:max(n, 0)] {
		o.wrote(k)
	}
	if err == nil {
		return
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		o.noBatch = true
		n = 0
	}
	// Retry what the kernel did not take one by one.
	for i := max(n, 0); i < len(keys); i++ {
		if err := o.put(keys[i], values[i]); err != nil {
			failed[keys[i]] = err
		}
	}
}

// DeleteBatch implements reconciler.BatchOperations.
func (o *Ops[Obj, K, V]) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	keys := make([]K, len(batch))
	for i := range batch {
		keys[i] = o.Key(batch[i].Object)
	}
	stay, err := o.beforeDelete(ctx, txn, keys)
	if err != nil {
		for i := range batch {
			batch[i].Result = err
		}
		return
	}
	if len(stay) > 0 {
		n := 0
		for i := range batch {
			if err := stay[keys[i]]; err != nil {
				batch[i].Result = err
				continue
			}
			batch[n], keys[n] = batch[i], keys[i]
			n++
		}
		batch, keys = batch[:n], keys[:n]
	}
	done := 0
	if !o.noBatch {
		n, err := o.Target().BatchDelete(keys, nil)
		for _, k := range keys[:max(n, 0)] {
			o.forget(k)
		}
		switch {
		case err == nil:
			return
		case errors.Is(err, ebpf.ErrNotSupported):
			o.noBatch = true
		default:
			// A missing key stops the batch; the rest go one by one.
			done = n
		}
	}
	for i := done; i < len(batch); i++ {
		batch[i].Result = o.deleteKey(o.Key(batch[i].Object))
	}
}

// sortTogether sorts keys by order, moving each value with its key.
func sortTogether[K, V any](keys []K, values []V, order func(a, b K) int) {
	if slices.IsSortedFunc(keys, order) {
		return
	}
	perm := make([]int, len(keys))
	for i := range perm {
		perm[i] = i
	}
	slices.SortFunc(perm, func(a, b int) int { return order(keys[a], keys[b]) })
	sortedKeys, sortedValues := make([]K, len(keys)), make([]V, len(values))
	for i, j := range perm {
		sortedKeys[i], sortedValues[i] = keys[j], values[j]
	}
	copy(keys, sortedKeys)
	copy(values, sortedValues)
}
