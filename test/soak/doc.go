// SPDX-License-Identifier: Apache-2.0

// Package soak holds the agent's long-running reliability tests: the whole
// control plane (cells.ControlPlane) over real pinned BPF maps in a private
// bpffs mount, driven by random policy-file and ipcache-owner churn, and
// checked for convergence, reference-count invariants and leaks.
//
// The tests are privileged (root: bpffs, BPF maps): they skip with a
// message when not root, except under CI=true. How long the churn runs:
//
//	go test -race ./test/soak/ -soak.duration=2m -soak.seed=42
//
// or IPCACHE_SOAK_DURATION and IPCACHE_SOAK_SEED in the environment. The
// default is 60 s, 5 s with -short; the seed is logged, and the same seed
// replays the same operations (their timing against the agent differs).
package soak
