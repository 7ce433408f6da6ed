// SPDX-License-Identifier: Apache-2.0

package endpointcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// Endpoints is the endpoint.Registry: it keeps the `endpoints` table, the
// label identity reference of each endpoint, and the ipcache entries of
// their addresses.
//
// Changes are serialized (mu): an upsert checks the addresses against
// every other endpoint, allocates, writes the row and the ipcache, and no
// other change may come between the check and the write.
type Endpoints struct {
	cfg       Config
	log       *slog.Logger
	db        *statedb.DB
	table     statedb.RWTable[*endpoint.State]
	allocator *identitycell.Allocator
	ipcache   *ipcachecell.IPCache
	enforced  endpoint.Enforcement // nil without a datapath

	mu         sync.Mutex
	sources    map[string]*endpointSource
	namespaces map[string]map[string]string // namespace -> its labels
	started    bool
	// pending counts the sources created before start that have not said
	// Initialized; initialized marks the table, the ipcache producer and
	// the allocator's producer done when it drops to zero after start.
	pending     int
	initialized func()
}

var _ endpoint.Registry = (*Endpoints)(nil)

// NewSource implements endpoint.Registry.
func (e *Endpoints) NewSource(owner string) (endpoint.Source, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.sources[owner]; ok {
		return nil, fmt.Errorf("endpoint source %q: %w", owner, endpoint.ErrSourceExists)
	}
	handle, err := e.ipcache.NewHandle("endpoint/"+owner, sourceOf(owner))
	if err != nil {
		return nil, fmt.Errorf("endpoint source %q: %w", owner, err)
	}
	s := &endpointSource{registry: e, owner: owner, handle: handle, holdsInit: !e.started}
	if s.holdsInit {
		e.pending++
	}
	e.sources[owner] = s
	return s, nil
}

// sourceOf is the ipcache source of an endpoint source's addresses: the
// endpoint directory's are `directory`, as the policy directory's; the
// others (the CNI plugin, embedders) are this node's own, `local`.
func sourceOf(owner string) source.Source {
	if owner == DirectoryOwner {
		return source.Directory
	}
	return source.Local
}

// start marks the hive started: sources created from now on hold no
// initialization. If none held it, the table is initialized now.
func (e *Endpoints) start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.started = true
	e.maybeInitialized()
}

func (e *Endpoints) maybeInitialized() {
	if e.started && e.pending == 0 && e.initialized != nil {
		e.initialized()
		e.initialized = nil
	}
}

// endpointSource is one owner's endpoint.Source.
type endpointSource struct {
	registry  *Endpoints
	owner     string
	handle    *ipcachecell.Handle
	holdsInit bool
	done      bool
}

// Upsert implements endpoint.Source.
func (s *endpointSource) Upsert(ep endpoint.Endpoint) (*endpoint.State, error) {
	e := s.registry
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.upsert(s, ep)
}

// Delete implements endpoint.Source.
func (s *endpointSource) Delete(id string) error {
	e := s.registry
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.delete(s, id)
}

// Initialized implements endpoint.Source.
func (s *endpointSource) Initialized() {
	e := s.registry
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.holdsInit && !s.done {
		s.done = true
		e.pending--
		e.maybeInitialized()
	}
}

// WaitEnforced implements endpoint.Source.
func (s *endpointSource) WaitEnforced(ctx context.Context, id string) error {
	e := s.registry
	row, rev, found := e.table.Get(e.db.ReadTxn(), endpoint.NameIndex.Query(id))
	if !found || row.Owner != s.owner {
		return fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	}
	if e.enforced == nil {
		return nil
	}
	return e.enforced.WaitEnforced(ctx, id, rev)
}

// upsert registers ep for s. Called with mu held.
func (e *Endpoints) upsert(s *endpointSource, ep endpoint.Endpoint) (*endpoint.State, error) {
	if ep.Namespace == "" {
		ep.Namespace = endpoint.DefaultNamespace
	}
	if err := ep.Validate(); err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", ep.ID(), err)
	}
	ep.Addresses = endpoint.SortedAddresses(ep.Addresses)
	lbls, err := ep.IdentityLabels(e.namespaces[ep.Namespace])
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w: %w", ep.ID(), endpoint.ErrInvalid, err)
	}

	txn := e.allocator.WriteTxn(e.table)
	defer txn.Abort()
	old, _, exists := e.table.Get(txn, endpoint.NameIndex.Query(ep.ID()))
	switch {
	case exists && old.Owner != s.owner:
		return nil, fmt.Errorf("endpoint %s (registered by %s): %w", ep.ID(), old.Owner, endpoint.ErrOwnedByOther)
	case !exists && e.table.NumObjects(txn) >= int(e.cfg.EndpointMaxEntries):
		return nil, fmt.Errorf("endpoint %s: %d endpoints (--endpoint-max-entries): %w",
			ep.ID(), e.cfg.EndpointMaxEntries, endpoint.ErrTooMany)
	}
	for _, addr := range ep.Addresses {
		if other, _, found := e.table.Get(txn, endpoint.AddressIndex.Query(addr)); found && other.ID() != ep.ID() {
			return nil, fmt.Errorf("endpoint %s: address %s: %w: %s", ep.ID(), addr, endpoint.ErrAddressInUse, other.ID())
		}
	}

	row := &endpoint.State{Endpoint: ep, IdentityLabels: lbls, Local: ep.IsLocal(e.cfg.NodeName), Owner: s.owner}
	var releaseOld identity.Number
	switch {
	case exists && old.IdentityLabels == lbls:
		row.Identity = old.Identity
	default:
		// A new identity is referenced before the old one is released, and
		// the old one only once the addresses no longer map to it.
		if row.Identity, err = e.allocator.AllocateTxn(txn, lbls, identity.Unknown); err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", ep.ID(), err)
		}
		if exists {
			releaseOld = old.Identity
		}
	}
	if exists && sameState(old, row) {
		return old, nil
	}
	if _, _, err := e.table.Insert(txn, row); err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", ep.ID(), err)
	}
	txn.Commit()

	var gone []netip.Addr
	if exists {
		gone = removed(old.Addresses, ep.Addresses)
	}
	if err := e.writeIPCache(s, ep.Addresses, gone, row.Identity); err != nil {
		// The row stays: the endpoint is registered, its ipcache entries
		// are what failed (the ipcache's limits), and a later upsert or
		// delete repairs them.
		e.log.Error("Endpoint's addresses not in the ipcache", "endpoint", ep.ID(), "error", err)
	}
	if releaseOld != identity.Unknown {
		// The old identity goes only once the ipcache table maps the
		// addresses to the new one: the datapath deletes an identity's
		// policy entries once no entry of that table points at it, and
		// the handle's upsert is in the table only when resolved. Released
		// earlier, a peer's flows both identities allow would drop.
		e.waitResolved(ep.ID())
		e.release(releaseOld)
	}
	e.log.Info("Endpoint registered", "endpoint", ep.ID(), "owner", s.owner, "identity", row.Identity,
		"addresses", ep.Addresses, "interface", ep.Interface, "local", row.Local)
	return row, nil
}

// delete removes s's endpoint id. Called with mu held.
func (e *Endpoints) delete(s *endpointSource, id string) error {
	old, _, exists := e.table.Get(e.db.ReadTxn(), endpoint.NameIndex.Query(id))
	switch {
	case !exists:
		return nil
	case old.Owner != s.owner:
		return fmt.Errorf("endpoint %s (registered by %s): %w", id, old.Owner, endpoint.ErrOwnedByOther)
	}
	// The row goes first, so the datapath takes the addresses out of its
	// `endpoints` map, then the ipcache entries, then the reference.
	txn := e.db.WriteTxn(e.table)
	if _, _, err := e.table.Delete(txn, old); err != nil {
		txn.Abort()
		return fmt.Errorf("delete endpoint %s: %w", id, err)
	}
	txn.Commit()
	if err := e.writeIPCache(s, nil, old.Addresses, old.Identity); err != nil {
		e.log.Error("Endpoint's addresses not removed from the ipcache", "endpoint", id, "error", err)
	}
	e.release(old.Identity)
	e.log.Info("Endpoint removed", "endpoint", id, "owner", s.owner, "identity", old.Identity)
	return nil
}

// writeIPCache maps addrs to id and removes gone.
func (e *Endpoints) writeIPCache(s *endpointSource, addrs, gone []netip.Addr, id identity.Number) error {
	var errs []error
	if len(addrs) > 0 {
		batch := make([]ipcachecell.PrefixUpsert, len(addrs))
		for i, a := range addrs {
			batch[i] = ipcachecell.PrefixUpsert{Prefix: netip.PrefixFrom(a, a.BitLen()),
				Metadata: ipcachecell.Metadata{ExplicitIdentity: id}}
		}
		errs = append(errs, s.handle.UpsertBatch(batch))
	}
	if len(gone) > 0 {
		prefixes := make([]netip.Prefix, len(gone))
		for i, a := range gone {
			prefixes[i] = netip.PrefixFrom(a, a.BitLen())
		}
		errs = append(errs, s.handle.RemoveBatch(prefixes))
	}
	return errors.Join(errs...)
}

// resolveWait bounds how long a relabel waits for the ipcache to resolve
// the new identity before releasing the old one (a stopping agent's
// resolver resolves nothing more).
const resolveWait = 10 * time.Second

// waitResolved waits until the ipcache has resolved what the endpoint's
// handle wrote, or resolveWait passes (then the old identity is released
// anyway, and that is logged: its entries may go before the addresses
// move).
func (e *Endpoints) waitResolved(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), resolveWait)
	defer cancel()
	if err := e.ipcache.WaitResolved(ctx); err != nil {
		e.log.Warn("The ipcache did not resolve an endpoint's new identity in time: its old identity is released anyway",
			"endpoint", name, "waited", resolveWait, "error", err)
	}
}

// release drops the endpoint cell's reference to id.
func (e *Endpoints) release(id identity.Number) {
	txn := e.allocator.WriteTxn()
	if _, err := e.allocator.ReleaseTxn(txn, id); err != nil {
		txn.Abort()
		// Only a reference this cell took is released: failing is a bug.
		e.log.Error("Release of an endpoint's identity failed", "identity", id, "error", err)
		return
	}
	txn.Commit()
}

// SetNamespace sets the labels of a namespace and relabels its endpoints
// (nil labels: the namespace is unknown again). Endpoints whose identity
// cannot change (an exhausted identity space) keep their old one, and
// the error says which.
//
// Possible errors: the upserts' (joined).
func (e *Endpoints) SetNamespace(name string, lbls map[string]string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if maps.Equal(e.namespaces[name], lbls) {
		return nil
	}
	if lbls == nil {
		delete(e.namespaces, name)
	} else {
		e.namespaces[name] = maps.Clone(lbls)
	}
	var errs []error
	for row := range e.table.All(e.db.ReadTxn()) {
		if row.Namespace != name {
			continue
		}
		if _, err := e.upsert(e.sources[row.Owner], row.Endpoint); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sameState reports whether two rows say the same.
func sameState(a, b *endpoint.State) bool {
	return a.Identity == b.Identity && a.IdentityLabels == b.IdentityLabels && a.Local == b.Local &&
		a.Owner == b.Owner && a.Interface == b.Interface && a.Node == b.Node &&
		maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Addresses, b.Addresses)
}

// removed returns the addresses of before that are not in after (both
// sorted).
func removed(before, after []netip.Addr) []netip.Addr {
	var gone []netip.Addr
	for _, a := range before {
		if _, found := slices.BinarySearchFunc(after, a, netip.Addr.Compare); !found {
			gone = append(gone, a)
		}
	}
	return gone
}
