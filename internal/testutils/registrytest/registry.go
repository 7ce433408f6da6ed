// SPDX-License-Identifier: Apache-2.0

// Package registrytest is an endpoint.Registry for the tests of the
// endpoint sources: it keeps the endpoints in memory, refuses what the
// endpoint cell refuses (no address, an address of another endpoint,
// another source's endpoint, more than a limit), records every call, and
// simulates WaitEnforced with a delay the test sets.
package registrytest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
)

// Call is one call on a source: Method is "Upsert", "Delete",
// "Initialized" or "WaitEnforced"; ID is the endpoint's.
type Call struct {
	Owner  string
	Method string
	ID     string
}

// Registry is an in-memory endpoint.Registry.
type Registry struct {
	// MaxEndpoints bounds the endpoints of all sources (0: no bound).
	MaxEndpoints int
	// EnforceDelay is how long WaitEnforced takes for a registered
	// endpoint.
	EnforceDelay time.Duration

	mu          sync.Mutex
	sources     map[string]bool
	endpoints   map[string]entry
	calls       []Call
	initialized map[string]bool
}

type entry struct {
	owner string
	ep    endpoint.Endpoint
}

var _ endpoint.Registry = (*Registry)(nil)

// New returns an empty Registry.
func New() *Registry {
	return &Registry{
		sources:     make(map[string]bool),
		endpoints:   make(map[string]entry),
		initialized: make(map[string]bool),
	}
}

// NewSource implements endpoint.Registry.
func (r *Registry) NewSource(owner string) (endpoint.Source, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sources[owner] {
		return nil, fmt.Errorf("%w: %s", endpoint.ErrSourceExists, owner)
	}
	r.sources[owner] = true
	return &source{r: r, owner: owner}, nil
}

// Endpoints returns the registered endpoints by ID.
func (r *Registry) Endpoints() map[string]endpoint.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	eps := make(map[string]endpoint.Endpoint, len(r.endpoints))
	for id, e := range r.endpoints {
		eps[id] = e.ep
	}
	return eps
}

// Calls returns the calls made so far, in order.
func (r *Registry) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// Initialized reports whether owner's source called Initialized.
func (r *Registry) Initialized(owner string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.initialized[owner]
}

// Put registers ep as owner's without a call being recorded: an endpoint
// of another source (the endpoint directory, say) for a test's set-up.
func (r *Registry) Put(owner string, ep endpoint.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints[ep.ID()] = entry{owner: owner, ep: ep}
}

type source struct {
	r     *Registry
	owner string
}

func (s *source) record(method, id string) {
	s.r.calls = append(s.r.calls, Call{Owner: s.owner, Method: method, ID: id})
}

func (s *source) Upsert(ep endpoint.Endpoint) (*endpoint.State, error) {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	id := ep.ID()
	s.record("Upsert", id)
	if len(ep.Addresses) == 0 {
		return nil, fmt.Errorf("%w: endpoint %s: no addresses", endpoint.ErrInvalid, id)
	}
	old, exists := r.endpoints[id]
	if exists && old.owner != s.owner {
		return nil, fmt.Errorf("endpoint %s: %w (%s)", id, endpoint.ErrOwnedByOther, old.owner)
	}
	for otherID, other := range r.endpoints {
		if otherID == id {
			continue
		}
		for _, a := range ep.Addresses {
			if slices.Contains(other.ep.Addresses, a) {
				return nil, fmt.Errorf("endpoint %s: address %s: %w %s", id, a, endpoint.ErrAddressInUse, otherID)
			}
		}
	}
	if !exists && r.MaxEndpoints > 0 && len(r.endpoints) >= r.MaxEndpoints {
		return nil, fmt.Errorf("endpoint %s: %w (at most %d)", id, endpoint.ErrTooMany, r.MaxEndpoints)
	}
	ep.Labels = maps.Clone(ep.Labels)
	ep.Addresses = slices.Clone(ep.Addresses)
	r.endpoints[id] = entry{owner: s.owner, ep: ep}
	return &endpoint.State{Endpoint: ep, Owner: s.owner, Local: true}, nil
}

func (s *source) Delete(id string) error {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	s.record("Delete", id)
	old, exists := r.endpoints[id]
	if !exists {
		return nil
	}
	if old.owner != s.owner {
		return fmt.Errorf("endpoint %s: %w (%s)", id, endpoint.ErrOwnedByOther, old.owner)
	}
	delete(r.endpoints, id)
	return nil
}

func (s *source) Initialized() {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	s.record("Initialized", "")
	r.initialized[s.owner] = true
}

func (s *source) WaitEnforced(ctx context.Context, id string) error {
	r := s.r
	r.mu.Lock()
	s.record("WaitEnforced", id)
	_, exists := r.endpoints[id]
	delay := r.EnforceDelay
	r.mu.Unlock()
	if !exists {
		return fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	}
	select {
	case <-time.After(delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
