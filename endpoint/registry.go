// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"context"

	"github.com/cilium/statedb"
)

// Registry is where the sources of endpoints (the endpoint directory, the
// CNI plugin's server, an embedder) register them. The endpoint cell
// provides it.
type Registry interface {
	// NewSource returns the source owner (for example "cni"): the
	// endpoints it upserts are its own, and it removes only those. The
	// `endpoints` table is initialized, and the ipcache may prune, only
	// once every source returned before the hive started has called
	// Initialized. Call before the hive starts, or later for a source
	// that does not hold initialization.
	//
	// Possible errors: ErrSourceExists (wrapped) when owner already has one.
	NewSource(owner string) (Source, error)
}

// Source is one owner's view of the endpoints.
type Source interface {
	// Upsert registers ep, or replaces the source's endpoint of the same
	// ID, and returns once the `endpoints` table has it. Its policy may
	// not be in the kernel yet: WaitEnforced waits for that.
	//
	// Possible errors: ErrInvalid (wrapped, saying which field), ErrAddressInUse
	// (wrapped, naming the endpoint that has the address), ErrOwnedByOther
	// (another source registered that ID), ErrTooMany, the identity
	// allocator's errors.
	Upsert(ep Endpoint) (*State, error)

	// Delete removes the source's endpoint id ("<namespace>/<name>"); an
	// unknown id is no error.
	//
	// Possible errors: ErrOwnedByOther.
	Delete(id string) error

	// Initialized says the source has upserted everything it had at start.
	Initialized()

	// WaitEnforced returns once the endpoint id's addresses, policy
	// entries and enforcement are in the kernel maps, so that its first
	// packet is enforced.
	//
	// Possible errors: ctx's, ErrNotFound.
	WaitEnforced(ctx context.Context, id string) error
}

// Enforcement tells when an endpoint is in the kernel maps. The datapath
// provides it; the endpoint cell's Source.WaitEnforced waits on it.
type Enforcement interface {
	// WaitEnforced blocks until the `endpoints` row of id at table
	// revision rev, or a later one, is in the kernel maps: its addresses
	// in the `endpoints` map, its identity's policy entries and
	// enforcement in place before them.
	//
	// Possible errors: ctx's; an error saying why the row cannot be
	// written (a full map).
	WaitEnforced(ctx context.Context, id string, rev statedb.Revision) error
}
