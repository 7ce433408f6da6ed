// SPDX-License-Identifier: Apache-2.0

// Package progress publishes how far a job has come, for other jobs to wait
// on: a value that only moves forward, and a channel closed when it moves.
//
// It is how the cells order their writes without sharing a goroutine: the
// ipcache resolver says up to which metadata revision it has resolved, the
// policy selectors up to which revisions they have computed the policy
// tables, and the datapath waits on those before it writes what depends on
// them (make before break: datapathcell/README.md).
package progress

import (
	"context"
	"sync"
)

// Tracker holds the progress of one job. The zero value is not usable: use
// [New].
type Tracker[T any] struct {
	mu      sync.Mutex
	value   T
	changed chan struct{}
}

// New returns a tracker that starts at initial.
func New[T any](initial T) *Tracker[T] {
	return &Tracker[T]{value: initial, changed: make(chan struct{})}
}

// Set publishes a new value and wakes the waiters.
func (t *Tracker[T]) Set(value T) {
	t.mu.Lock()
	t.value = value
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// Get returns the current value and a channel that is closed when it
// changes.
func (t *Tracker[T]) Get() (T, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.value, t.changed
}

// Wait blocks until reached holds for the current value, and returns that
// value.
//
// Possible errors: ctx's, with the value at that moment.
func (t *Tracker[T]) Wait(ctx context.Context, reached func(T) bool) (T, error) {
	for {
		value, changed := t.Get()
		if reached(value) {
			return value, nil
		}
		select {
		case <-ctx.Done():
			return value, ctx.Err()
		case <-changed:
		}
	}
}
