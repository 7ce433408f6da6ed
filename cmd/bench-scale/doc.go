// SPDX-License-Identifier: Apache-2.0

// Command bench-scale is the scale benchmark behind `make bench-scale`: for
// N prefixes (100k and 1M, IPv4 only and mixed IPv4/IPv6) it measures, in
// one process and one run, the agent's cells against the kernel's own floor:
//
//  1. floor: one raw BatchUpdate of the N keys, in random order, into a
//     fresh LPM trie of the ipcache map's layout (and, for reference, the
//     same keys in address order); and a second floor, in process:
//     inserting the N entries straight into a table like `ipcache`, which
//     bounds how close a design on statedb tables can come to the first;
//  2. end to end: an owner upserts the N prefixes through an ipcache
//     resource handle, until the pinned ipcache map holds them all
//     (metadata, identities, the desired table, the reconciler, the kernel);
//  3. restart: a new agent over the same pinned map and state directory,
//     whose owner re-asserts the same N prefixes, until the `ipcache` table
//     is initialized and the map reconciled; it counts the BPF writes whose
//     value the map already held, and checks that every prefix kept its
//     identity number;
//  4. grace expiry: a new agent whose N restored prefixes nobody
//     re-asserts; the time to release them all (until the map is empty of
//     them), and the latency of single unrelated upserts made meanwhile
//     (until the prefix is in the pinned map), against the same latency
//     measured before the expiry;
//  5. heap in use per prefix after step 2, after GC (all tables, the
//     reconcilers' state, everything the agent holds), once the first
//     prune of the map is over (until then the reconciler keeps a copy of
//     what the map holds; the prune starts as the table is initialized);
//     and the same of step 3's agent, measured after its time is taken:
//     what an agent holds during the grace period after a restart.
//
// Steps 2, 3 and 4 each start their agent from a collected heap, holding
// nothing of what ran before, as a new process would: a restart is a new
// process. Left uncollected, the stopped agent's heap made step 3 pay for
// memory no restart has.
//
// Beside the times, the table has the process's CPU time (user and system)
// of step 2 and its ratio to that of step 1's random-order write: on a
// machine shared with other work it moves less than the times do.
// -e2e-cpuprofile and -restart-cpuprofile profile step 2 or 3 alone,
// -mutexprofile the whole run; -end-to-end-only skips steps 3 and 4.
//
// It prints one table, and as its last line, for 1M IPv4 prefixes:
//
//	ratio end_to_end=X restart_writes=N restart_ratio=Y grace_p99_ms=Z heap_bytes_per_prefix=W
//
// X is step 2's time over step 1's random-order floor, N the unchanged-value
// writes of step 3, Y step 3's time over step 2's, Z the p99 latency of an
// unrelated upsert during step 4, W the heap of step 5. It needs root (BPF
// maps, a private bpffs mount).
package main
