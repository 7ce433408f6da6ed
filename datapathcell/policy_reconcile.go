package datapathcell

import (
	"context"
	"fmt"
	"iter"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/policycell"
)

// enforcementValue is the enforcement map's value: 1 when enforced.
type enforcementValue uint32

func (d *Datapath) policyMap() *ebpf.Map {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.maps.Policy
}

func (d *Datapath) enforcementMap() *ebpf.Map {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.maps.Enforcement
}

func registerPolicyReconcilers(params reconciler.Params, d *Datapath,
	policies policycell.PolicyReconcilerTable, enforcement policycell.EnforcementReconcilerTable) error {
	policyOps := &mapOps[*policycell.PolicyEntry, PolicyKey, PolicyValue]{
		name:  PolicyMapName,
		m:     d.policyMap,
		stats: d.writeStats(PolicyMapName),
		key: func(e *policycell.PolicyEntry) PolicyKey {
			return NewPolicyKey(uint32(e.Key.Identity), uint8(e.Key.Direction), uint8(e.Key.Protocol), e.Key.Port)
		},
		value: func(e *policycell.PolicyEntry) PolicyValue { return NewPolicyValue(uint32(e.Verdict)) },
	}
	if _, err := reconciler.Register(params, policies.RWTable,
		(*policycell.PolicyEntry).Clone, (*policycell.PolicyEntry).SetStatus, (*policycell.PolicyEntry).GetStatus,
		policyOps, policyOps, reconcilerOptions(PolicyMapName)...); err != nil {
		return fmt.Errorf("register policy reconciler: %w", err)
	}

	// The enforcement map is an array: every index always exists, so it is
	// never pruned and "deleting" a direction writes 0 (not enforced).
	enforcementOps := &mapOps[*policycell.Enforcement, uint32, enforcementValue]{
		name:  EnforcementMapName,
		m:     d.enforcementMap,
		stats: d.writeStats(EnforcementMapName),
		key:   func(e *policycell.Enforcement) uint32 { return uint32(e.Direction) },
		value: func(e *policycell.Enforcement) enforcementValue {
			if e.Enforced {
				return 1
			}
			return 0
		},
	}
	if _, err := reconciler.Register(params, enforcement.RWTable,
		(*policycell.Enforcement).Clone, (*policycell.Enforcement).SetStatus, (*policycell.Enforcement).GetStatus,
		arrayOps[*policycell.Enforcement, enforcementValue]{enforcementOps}, nil,
		reconciler.WithName(EnforcementMapName), reconciler.WithoutPruning()); err != nil {
		return fmt.Errorf("register enforcement reconciler: %w", err)
	}
	return nil
}

// arrayOps reconciles a table into an array map, whose entries always exist
// and cannot be deleted: deleting an object resets its entry to the zero
// value, and there is nothing to prune.
type arrayOps[Obj any, V comparable] struct {
	*mapOps[Obj, uint32, V]
}

// Delete implements reconciler.Operations.
func (o arrayOps[Obj, V]) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	k := o.key(obj)
	var zero V
	return o.put(k, zero)
}

// Prune implements reconciler.Operations.
func (o arrayOps[Obj, V]) Prune(context.Context, statedb.ReadTxn, iter.Seq2[Obj, statedb.Revision]) error {
	return nil
}
