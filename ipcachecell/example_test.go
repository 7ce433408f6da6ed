// SPDX-License-Identifier: Apache-2.0

package ipcachecell_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// exampleHive is what the examples read from their hive.
type exampleHive struct {
	db         *statedb.DB
	ipcache    *ipcachecell.IPCache
	entries    statedb.Table[*ipcachecell.Entry]
	identities statedb.Table[*identitycell.Identity]
}

// newExampleHive composes a hive of the cells the ipcache needs (the
// infrastructure of cells.NewHive, and the identity allocator), with the
// identity checkpoint in stateDir, and extra cells of the caller. No
// datapath: nothing needs privileges.
func newExampleHive(stateDir string, extra ...cell.Cell) (*hive.Hive, *exampleHive) {
	var x exampleHive
	h := cells.NewHive(append([]cell.Cell{
		identitycell.Cell,
		ipcachecell.Cell,
		cell.Invoke(func(db *statedb.DB, c *ipcachecell.IPCache, e statedb.Table[*ipcachecell.Entry],
			i statedb.Table[*identitycell.Identity]) {
			x = exampleHive{db, c, e, i}
		}),
	}, extra...)...)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Set("state-dir", stateDir); err != nil {
		panic(err)
	}
	return h, &x
}

// An owner of prefixes (here "policy/web") obtains a handle for its
// resource, upserts a prefix with labels through it and waits until the
// prefix is resolved: the `ipcache` table then maps it to an identity,
// whose labels are the owners' plus the prefix's own cidr label.
func Example_ownAHandle() {
	stateDir, _ := os.MkdirTemp("", "ipcachecell-example")
	defer os.RemoveAll(stateDir)
	h, x := newExampleHive(stateDir)
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	if err := h.Start(log, ctx); err != nil {
		panic(err)
	}
	defer h.Stop(log, ctx)

	handle, err := x.ipcache.NewHandle("policy/web", source.Local)
	if err != nil {
		panic(err)
	}
	prefix := netip.MustParsePrefix("10.0.0.0/8")
	lbls, _ := labels.New("app:web")
	if err := handle.Upsert(prefix, ipcachecell.Metadata{Labels: lbls}); err != nil {
		panic(err)
	}
	if err := x.ipcache.WaitResolved(ctx); err != nil {
		panic(err)
	}

	txn := x.db.ReadTxn()
	entry, _, _ := x.entries.Get(txn, ipcachecell.EntryIndex.Query(prefix))
	identity, _, _ := x.identities.Get(txn, identitycell.IdentityIndex.Query(entry.Identity))
	fmt.Printf("%s -> local identity: %t, labels %s\n", entry.Prefix(), entry.Identity.IsLocal(), identity.Labels)
	// Output:
	// 10.0.0.0/8 -> local identity: true, labels app:web,cidr:10.0.0.0/8
}

// A producer of metadata registers before the hive starts and says when
// it has written what it has: only then is the `ipcache` table
// initialized (and may the datapath prune what is not in it).
func Example_registerAProducer() {
	stateDir, _ := os.MkdirTemp("", "ipcachecell-example")
	defer os.RemoveAll(stateDir)
	var done func()
	h, x := newExampleHive(stateDir, cell.Invoke(func(c *ipcachecell.IPCache) {
		done = c.RegisterProducer("my-producer")
	}))
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	if err := h.Start(log, ctx); err != nil {
		panic(err)
	}
	defer h.Stop(log, ctx)

	handle, err := x.ipcache.NewHandle("my-producer", source.Local)
	if err != nil {
		panic(err)
	}
	if err := handle.Upsert(netip.MustParsePrefix("192.0.2.0/24"), ipcachecell.Metadata{}); err != nil {
		panic(err)
	}
	if err := x.ipcache.WaitResolved(ctx); err != nil {
		panic(err)
	}
	initialized, initializedCh := x.entries.Initialized(x.db.ReadTxn())
	fmt.Println("resolved, producer not done; initialized:", initialized)

	done()
	<-initializedCh
	initialized, _ = x.entries.Initialized(x.db.ReadTxn())
	fmt.Println("producer done; initialized:", initialized, "with", x.entries.NumObjects(x.db.ReadTxn()), "entry")
	// Output:
	// resolved, producer not done; initialized: false
	// producer done; initialized: true with 1 entry
}

// Releasing a handle removes everything its resource said: a prefix that
// no other resource has metadata for leaves the `ipcache` table, and its
// identity reference is released.
func Example_releaseAHandle() {
	stateDir, _ := os.MkdirTemp("", "ipcachecell-example")
	defer os.RemoveAll(stateDir)
	h, x := newExampleHive(stateDir)
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	if err := h.Start(log, ctx); err != nil {
		panic(err)
	}
	defer h.Stop(log, ctx)

	handle, err := x.ipcache.NewHandle("policy/web", source.Local)
	if err != nil {
		panic(err)
	}
	prefix := netip.MustParsePrefix("10.0.0.0/8")
	if err := handle.Upsert(prefix, ipcachecell.Metadata{}); err != nil {
		panic(err)
	}
	if err := x.ipcache.WaitResolved(ctx); err != nil {
		panic(err)
	}
	_, _, found := x.entries.Get(x.db.ReadTxn(), ipcachecell.EntryIndex.Query(prefix))
	fmt.Println("before release:", prefix, "in ipcache:", found)

	if err := handle.Release(); err != nil {
		panic(err)
	}
	if err := x.ipcache.WaitResolved(ctx); err != nil {
		panic(err)
	}
	txn := x.db.ReadTxn()
	_, _, found = x.entries.Get(txn, ipcachecell.EntryIndex.Query(prefix))
	fmt.Println("after release:", prefix, "in ipcache:", found, "identities:", x.identities.NumObjects(txn))
	// Output:
	// before release: 10.0.0.0/8 in ipcache: true
	// after release: 10.0.0.0/8 in ipcache: false identities: 0
}
