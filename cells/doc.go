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
// step names what it waits on. One step relies on the position of its
// start hook, the owner lock (step 2, which says why); the others wait for
// what they read, and where a start hook reads another's output (step 5)
// or jobs use what a start hook opened (step 9), the order follows from
// the dependency: the hive appends a constructor's hooks before those of
// anything built over its value.
//
//  1. Construction and Invokes (before start): producers register. Restore
//     registers an ipcache producer and holds the allocator's local space
//     (identitycell.Allocator.HoldLocal) until its job (step 5) is done; the
//     policy directory and any embedding agent's cells register plain
//     producers (IPCache.RegisterProducer). The resolver registers as the
//     initializer of the `ipcache` table and, being the allocator's client,
//     as the producer of identities (Allocator.RegisterProducer); the
//     selector engine as the initializer of its tables. Jobs registered
//     here start among the start hooks, and wait as the steps below say.
//  2. Start hook, owner lock: the state directory and the pins are this
//     agent's, or start fails. It relies on being the first start hook
//     (cells.ControlPlane lists it first): it guards every hook that
//     touches the state directory or the pins, an embedding agent's
//     included, and those cannot all wait for it. It mounts bpffs at
//     --bpf-root if needed (never from a mount namespace other than the
//     host's) and records the mount in <state-dir>/bpffs-mount for
//     `cleanup`; its stop hook, the last, logs that the pins stay.
//  3. Start hook, Checkpointer: the state directory is made and probed
//     writable, the previous checkpoint is read; it is decoded in the
//     background. Checkpointer.Previous waits for it.
//  4. Start hook, Datapath: the pinned maps are opened, and the pinned
//     ipcache map is read once, before anything writes to it, on a
//     goroutine the hook starts last, so the hook does not wait for it:
//     the Datapath provides the read to restore (bpfmaps.PinnedIPCache).
//     The ipcache map's writer waits for the read's end, when the entries
//     are one snapshot in address order.
//     Steps 3 and 4 need no order between them.
//  5. Start hook, Restorer: it waits for step 3 (Checkpointer.Previous)
//     and withholds the checkpoint's label identities for their label
//     sets, before any endpoint source starts. Its hook runs after the
//     Checkpointer's by dependency, not by the order of the cells: the
//     Checkpointer appends its hook when constructed, and the Restorer is
//     built over it. A failure fails the start. Then restore's job
//     (started right after the hook, so "Started hive" no longer means
//     restored) takes the pinned map's entries as step 4
//     reads them; for every 64k entries, the previous run's local-scope
//     numbers are withheld (the allocator's bitmap) and told to the
//     ipcache (IPCache.AddPrevious: the resolver requests a prefix's old
//     number when its rows request none). Then it drops the decoded
//     checkpoint (Checkpointer.ForgetPrevious) and releases the local
//     space. A read that fails stops the agent. Restore speaks last: once
//     every other producer is done and resolved, it writes a row for each
//     told prefix nobody re-asserted, and is done ("Restored prefixes
//     from the pinned ipcache map").
//  6. Resolver job: it resolves continuously from the start, the owners'
//     re-asserted prefixes while restore's job runs: a prefix restore has
//     told gets its old number; one that needs a new local number
//     waits until that job is done (identitycell.ErrLocalHeld), so it
//     cannot take a number restore has yet to withhold. A told prefix
//     whose last row goes keeps its entry until restore gives it a row.
//     Once every
//     producer is done and resolution has caught up with what they wrote,
//     it marks the `ipcache` and `identities` tables initialized, in one
//     transaction.
//  7. The checkpoint job, which waited for `identities` initialized, writes
//     its first checkpoint (the previous one is kept until then, for a
//     crash).
//  8. The selector engine waits for the `policies` and `ipcache` tables to
//     be initialized, computes enforcement, and marks its tables
//     initialized.
//  9. Each datapath reconciler writes what its desired table holds, and
//     prunes only once that table is initialized: the first prune deletes
//     the pinned keys nobody asked for (ipcache map after step 6, policy
//     map after step 8). The reconcilers are jobs over the Datapath's maps:
//     the Datapath appends its start hook when it is constructed, before
//     the Invoke that registers them can run, so they start after step 4
//     whatever the order of the cells. Nothing reaches the ipcache map
//     before step 4's read is over: its writer waits for it.
//  10. Restore's grace period (--identity-restore-grace-period, counted
//     from the moment restore is done) ends; restore then also waits for
//     `ipcache` initialized (step 6), stops the ipcache keeping entries
//     for it (IPCache.ForgetPrevious), releases its handle gradually, then un-withholds the
//     numbers at the same pace: prefixes no other owner re-asserted leave
//     the map.
package cells
