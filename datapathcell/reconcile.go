package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"
)

// mapOps reconciles a statedb table into a BPF map: each object is one
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
// of a million written keys cost a second of CPU. After the first prune
// the copy is dropped: from then on the table changes only when the
// desired value does.
//
// Its methods are called from the reconciler's goroutine only.
type mapOps[Obj any, K comparable, V comparable] struct {
	name  string
	m     func() *ebpf.Map // set once the maps are open (start hook)
	key   func(Obj) K
	value func(Obj) V

	// writeOrder, if set, is the order in which a batch's keys are
	// written: the LPM trie inserts keys in address order several times
	// faster than in random order.
	writeOrder func(a, b K) int

	// noBatch is set once the kernel said the map has no batch operations.
	noBatch bool

	// readPinned, if set, returns what the map holds before the first
	// write, known without reading it (the ipcache map's snapshot, taken
	// at start); otherwise skipUnchanged reads the map.
	readPinned func() map[K]V
	// pinned is what the map held before the first write, with the values
	// written since to those keys, until the first prune; nil until read,
	// and after. The map holds no other key than these and those of
	// objects written (or deleted) by this reconciler.
	pinned map[K]V
	// pruned is set by the first prune: pinned is no longer kept.
	pruned bool

	stats *MapWriteStats
}

// MapWriteStats counts a reconciler's writes to its map.
type MapWriteStats struct {
	// Written counts keys written (updated or deleted).
	Written atomic.Uint64
	// Unchanged counts writes skipped because the map already held the
	// value (after a restart).
	Unchanged atomic.Uint64
	// Prunes counts completed prunes of the map.
	Prunes atomic.Uint64
}

// skipUnchanged drops from batch the objects whose value the map already
// holds, and records the others' values as written (they are about to be).
// It does nothing after the first prune.
func (o *mapOps[Obj, K, V]) skipUnchanged(keys []K, values []V) ([]K, []V) {
	if o.pruned {
		return keys, values
	}
	if o.pinned == nil && o.readPinned != nil {
		o.pinned = o.readPinned()
	}
	if o.pinned == nil {
		o.pinned = map[K]V{}
		if err := readEntries(o.m(), func(k K, v V) { o.pinned[k] = v }); err != nil {
			o.pinned = map[K]V{} // unknown: write everything
		}
	}
	n := 0
	for i := range keys {
		old, known := o.pinned[keys[i]]
		if known && old == values[i] {
			o.stats.Unchanged.Add(1)
			continue
		}
		// Recorded before the write: should the write fail, the entry is
		// retried, and a retry must not be skipped, so forget on failure
		// (see failedWrite).
		if known {
			o.pinned[keys[i]] = values[i]
		}
		keys[n], values[n] = keys[i], values[i]
		n++
	}
	return keys[:n], values[:n]
}

// failedWrite forgets what skipUnchanged recorded for a key whose write
// failed: the map's value for it is unknown.
func (o *mapOps[Obj, K, V]) failedWrite(k K) {
	if o.pinned != nil {
		delete(o.pinned, k)
	}
}

// forget marks keys as deleted (or pruned).
func (o *mapOps[Obj, K, V]) forget(k K) {
	if o.pinned != nil {
		delete(o.pinned, k)
	}
	o.stats.Written.Add(1)
}

var (
	_ reconciler.Operations[any]      = (*mapOps[any, int, int])(nil)
	_ reconciler.BatchOperations[any] = (*mapOps[any, int, int])(nil)
)

// Update implements reconciler.Operations.
func (o *mapOps[Obj, K, V]) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	keys, values := o.skipUnchanged([]K{o.key(obj)}, []V{o.value(obj)})
	if len(keys) == 0 {
		return nil
	}
	return o.put(keys[0], values[0])
}

func (o *mapOps[Obj, K, V]) put(k K, v V) error {
	if err := o.m().Put(&k, &v); err != nil {
		o.failedWrite(k)
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
			// What the kernel says of a full map (ENOSPC for an LPM trie,
			// E2BIG for a hash map) does not say so.
			return fmt.Errorf("%s map is full (max entries %d; raise --%s-map-max-entries): %w",
				o.name, o.m().MaxEntries(), o.name, err)
		}
		return fmt.Errorf("%s map: update: %w", o.name, err)
	}
	o.stats.Written.Add(1)
	return nil
}

// Delete implements reconciler.Operations. Deleting a key the map does not
// have is not an error.
func (o *mapOps[Obj, K, V]) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	k := o.key(obj)
	if err := o.m().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("%s map: delete: %w", o.name, err)
	}
	o.forget(k)
	return nil
}

// Prune implements reconciler.Operations: it deletes every key of the map
// that no object has. The reconciler calls it only once the table is
// initialized, i.e. every producer of desired state has spoken.
//
// Until the first prune, the map holds pinned's keys and those of the
// objects this reconciler wrote; a written key whose object went was
// deleted by Delete. So the first prune finds the stale keys among
// pinned's, without reading the map again: at a million keys, the read
// took about a second of the reconciler's time, in which it wrote nothing
// (internal/benchscale, end to end and restart). Later prunes read the map.
func (o *mapOps[Obj, K, V]) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[Obj, statedb.Revision]) error {
	pinned := o.pinned
	o.pruned, o.pinned = true, nil
	var stale []K
	if pinned != nil {
		// pinned is dropped now: what is left of it once the desired
		// keys are taken out is what no object has.
		for obj := range objects {
			delete(pinned, o.key(obj))
		}
		stale = slices.Collect(maps.Keys(pinned))
	} else {
		desired := map[K]struct{}{}
		for obj := range objects {
			desired[o.key(obj)] = struct{}{}
		}
		// Collect first: deleting while iterating can make the kernel's
		// iteration restart or skip keys.
		err := readEntries(o.m(), func(k K, _ V) {
			if _, ok := desired[k]; !ok {
				stale = append(stale, k)
			}
		})
		if err != nil {
			return fmt.Errorf("%s map: prune: read: %w", o.name, err)
		}
	}
	var errs []error
	for _, k := range stale {
		if err := o.m().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
			continue
		}
		o.forget(k)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s map: prune %d stale keys: %w", o.name, len(stale), err)
	}
	o.stats.Prunes.Add(1)
	return nil
}

// UpdateBatch implements reconciler.BatchOperations. On a partial failure
// the entries the kernel did not take are retried one by one, so that each
// object's status says exactly whether it is in the map.
func (o *mapOps[Obj, K, V]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	if o.noBatch {
		for i := range batch {
			batch[i].Result = o.Update(ctx, txn, batch[i].Revision, batch[i].Object)
		}
		return
	}
	keys := make([]K, len(batch))
	values := make([]V, len(batch))
	for i := range batch {
		keys[i], values[i] = o.key(batch[i].Object), o.value(batch[i].Object)
	}
	keys, values = o.skipUnchanged(keys, values)
	if len(keys) == 0 {
		return
	}
	if o.writeOrder != nil {
		sortTogether(keys, values, o.writeOrder)
	}
	n, err := o.m().BatchUpdate(keys, values, nil)
	o.stats.Written.Add(uint64(max(n, 0)))
	if err == nil {
		return
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		o.noBatch = true
		n = 0
	}
	// Retry what the kernel did not take one by one, and give each object
	// the result of its own key.
	failed := map[K]error{}
	for i := max(n, 0); i < len(keys); i++ {
		if err := o.put(keys[i], values[i]); err != nil {
			failed[keys[i]] = err
		}
	}
	for i := range batch {
		batch[i].Result = failed[o.key(batch[i].Object)]
	}
}

// DeleteBatch implements reconciler.BatchOperations.
func (o *mapOps[Obj, K, V]) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	done := 0
	if !o.noBatch {
		keys := make([]K, len(batch))
		for i := range batch {
			keys[i] = o.key(batch[i].Object)
		}
		n, err := o.m().BatchDelete(keys, nil)
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
		batch[i].Result = o.Delete(ctx, txn, batch[i].Revision, batch[i].Object)
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
