// SPDX-License-Identifier: Apache-2.0

// Package cells composes ipcache-agent from its cells and holds the small
// cells every agent needs and no cell owns: logging, health, the shell, and
// the owner lock that makes one agent at a time the owner of a state
// directory and of the pins under a bpffs root.
//
// [NewHive] builds a hive from [Infrastructure] and the given cells; the
// agent runs [ControlPlane].
// An agent that embeds ipcache-agent builds its own hive from the same
// groups plus its own cells.
//
// # Start sequence
//
// From hive start to the first prune and the end of the grace period. Each
// step names what it waits on; nothing relies on start-hook order except
// where a step says "start hook, after".
//
//  1. Construction and Invokes (before start): producers register. The
//     restore cell's Invoke registers an `identities` initializer (Allocator.RegisterInitializer)
//     and an ipcache producer with ipcachecell.HoldsResolution; the policy
//     directory and any embedding agent's cells register plain producers
//     (IPCache.RegisterProducer). The resolver registers itself as the
//     `ipcache` table's initializer; the selector engine as the initializer
//     of its tables.
//  2. Start hook, owner lock: the state directory and the pins are this
//     agent's, or start fails.
//  3. Start hook, Checkpointer: the state directory is made and probed
//     writable, the previous checkpoint is read; it is decoded in the
//     background (Checkpointer.Previous waits for it).
//  4. Start hook, Datapath: the pinned maps are opened and the pinned
//     ipcache map is read once, before anything writes to it
//     (Datapath.IPCacheSnapshot).
//  5. Start hook, Restorer (after 3 and 4, whose outputs it reads): the
//     previous run's local-scope entries are upserted through the restore
//     handle with their old numbers requested, the numbers are withheld,
//     and the restore producer is done: the resolver's gate opens.
//  6. Jobs start. The resolver waits for every HoldsResolution producer
//     (the gate), then resolves continuously. Once every producer is done
//     and resolution has caught up with what they wrote, it marks the
//     `ipcache` table initialized.
//  7. On `ipcache` initialized: restore marks the `identities` table
//     initialized; the checkpoint job, which waited for that, writes its
//     first checkpoint (the previous one is kept until then, for a crash).
//  8. The selector engine waits for the `policies` and `ipcache` tables to
//     be initialized, computes enforcement, and marks its tables
//     initialized.
//  9. Each datapath reconciler prunes only once its desired table is
//     initialized: the first prune deletes the pinned keys nobody asked
//     for (ipcache map after step 6, policy map after step 8).
//  10. Restore's grace period (--identity-restore-grace-period, counted
//     from step 5) ends; restore then also waits for `ipcache` initialized
//     (step 6), releases its handle gradually, and un-withholds the
//     numbers: prefixes no other owner re-asserted leave the map.
package cells
