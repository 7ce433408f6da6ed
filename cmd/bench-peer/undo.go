// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
)

// undo holds what a run made and has not removed yet (the agent and its
// pins, dnsmasq, perf, the namespaces, the scratch directory), so that an
// interrupt removes it before the process exits: a run stopped with ^C
// or SIGTERM leaves nothing behind, as one that ends does. The steps
// remove what they made with their defers; those go through add.
type undo struct {
	mu      sync.Mutex
	next    int
	pending map[int]func()
	// interrupted: what is added from now on is removed at once.
	interrupted bool
}

func newUndo() *undo { return &undo{pending: map[int]func(){}} }

// add registers remove and returns what runs it, once: the caller defers
// that. On a nil undo (tests that run steps alone) it returns remove.
func (u *undo) add(remove func()) func() {
	if u == nil {
		return remove
	}
	u.mu.Lock()
	if u.interrupted {
		u.mu.Unlock()
		remove()
		return func() {}
	}
	id := u.next
	u.next++
	u.pending[id] = remove
	u.mu.Unlock()
	return func() {
		u.mu.Lock()
		f, ok := u.pending[id]
		delete(u.pending, id)
		u.mu.Unlock()
		if ok {
			f()
		}
	}
}

// interrupt runs what is registered, the latest first (an agent is
// stopped before its namespace goes), and makes add run at once what
// comes after.
func (u *undo) interrupt() {
	u.mu.Lock()
	u.interrupted = true
	ids := make([]int, 0, len(u.pending))
	for id := range u.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	slices.Reverse(ids)
	fns := make([]func(), len(ids))
	for i, id := range ids {
		fns[i] = u.pending[id]
	}
	clear(u.pending)
	u.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

// onInterrupt undoes the run at the first SIGINT or SIGTERM and exits
// with 128 + the signal's number; a second signal acts as if none were
// caught (^C again stops at once).
func (u *undo) onInterrupt(progress io.Writer) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := (<-sigs).(syscall.Signal)
		signal.Reset(syscall.SIGINT, syscall.SIGTERM)
		fmt.Fprintf(progress, "bench-peer: %s: removing what the run made (again to stop at once)\n", sig)
		u.interrupt()
		os.Exit(128 + int(sig))
	}()
}
