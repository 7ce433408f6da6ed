package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// mapOps reconciles a statedb table into a BPF map: each object is one
// key/value. It implements the reconciler's per-object and batch
// operations; batches fall back to per-key writes when the kernel has no
// batch operations for the map type.
type mapOps[Obj any, K comparable, V any] struct {
	name  string
	m     func() *ebpf.Map // set once the maps are open (start hook)
	key   func(Obj) K
	value func(Obj) V

	// noBatch is set once the kernel said the map has no batch operations.
	// Only the reconciler's goroutine uses it.
	noBatch bool
}

var (
	_ reconciler.Operations[any]      = (*mapOps[any, int, int])(nil)
	_ reconciler.BatchOperations[any] = (*mapOps[any, int, int])(nil)
)

// Update implements reconciler.Operations.
func (o *mapOps[Obj, K, V]) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	k, v := o.key(obj), o.value(obj)
	if err := o.m().Put(&k, &v); err != nil {
		return fmt.Errorf("%s map: update: %w", o.name, err)
	}
	return nil
}

// Delete implements reconciler.Operations. Deleting a key the map does not
// have is not an error.
func (o *mapOps[Obj, K, V]) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	k := o.key(obj)
	if err := o.m().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("%s map: delete: %w", o.name, err)
	}
	return nil
}

// Prune implements reconciler.Operations: it deletes every key of the map
// that no object has. The reconciler calls it only once the table is
// initialized, i.e. every producer of desired state has spoken.
func (o *mapOps[Obj, K, V]) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[Obj, statedb.Revision]) error {
	desired := map[K]struct{}{}
	for obj := range objects {
		desired[o.key(obj)] = struct{}{}
	}
	// Collect first: deleting while iterating can make the kernel's
	// iteration restart or skip keys.
	var (
		stale []K
		k     K
		v     V
	)
	iter := o.m().Iterate()
	for iter.Next(&k, &v) {
		if _, ok := desired[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("%s map: prune: iterate: %w", o.name, err)
	}
	var errs []error
	for _, k := range stale {
		if err := o.m().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s map: prune %d stale keys: %w", o.name, len(stale), err)
	}
	return nil
}

// UpdateBatch implements reconciler.BatchOperations. On a partial failure
// the entries the kernel did not take are retried one by one, so that each
// object's status says exactly whether it is in the map.
func (o *mapOps[Obj, K, V]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	done := 0
	if !o.noBatch {
		keys := make([]K, len(batch))
		values := make([]V, len(batch))
		for i := range batch {
			keys[i], values[i] = o.key(batch[i].Object), o.value(batch[i].Object)
		}
		n, err := o.m().BatchUpdate(keys, values, nil)
		switch {
		case err == nil:
			return
		case errors.Is(err, ebpf.ErrNotSupported):
			o.noBatch = true
		default:
			done = n
		}
	}
	for i := done; i < len(batch); i++ {
		batch[i].Result = o.Update(ctx, txn, batch[i].Revision, batch[i].Object)
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
