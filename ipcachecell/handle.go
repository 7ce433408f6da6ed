// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cilium/statedb"
	"golang.org/x/time/rate"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/internal/progress"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// writeChunkSize bounds the rows written in one transaction by a batch, so
// that a large batch does not block other writers (and readers waiting for
// a commit) for long.
const writeChunkSize = 4096

// releaseChunkSize bounds the rows a release deletes in one transaction.
// It is smaller than writeChunkSize: a grace-period release of a million
// rows runs while other owners write, and each of its transactions holds
// their writes off.
const releaseChunkSize = 1024

// maxKnownPrefixes is the most prefixes a handle keeps a set of. A larger
// handle finds its rows by a scan of the table when it is released: the
// set would cost more memory per prefix than any other part of the ipcache
// but the tables themselves (docs/SCALE.md), and a release of that many
// rows is long anyway.
const maxKnownPrefixes = 1 << 16

// IPCache is the entry point for owners of prefix metadata: each obtains a
// [Handle] for its resource.
type IPCache struct {
	db       *statedb.DB
	metadata statedb.RWTable[*PrefixMetadata]
	// resolved is the `ipcache-metadata` revision up to which the resolver
	// has resolved every change.
	resolved *progress.Tracker[statedb.Revision]
	// entries and previous are the resolver's: the entries it wrote, and
	// what restore told it of the previous run (AddPrevious).
	entries  statedb.Table[*Entry]
	previous *previousNumbers

	mu sync.Mutex
	// live holds the owner of each resource with a live handle. Its id
	// is in the keys of the resource's rows instead of its name.
	live map[string]*owner
	// freeIDs are the ids of released resources, none of whose rows is
	// left. A new handle takes one before a new id, so that what the
	// IPCache keeps, and the length of the rows' keys, follows the
	// resources that have handles, not every name that ever had one (an
	// embedder naming a resource per workload).
	freeIDs []uint64
	nextID  uint64

	// pending is the producers that have not called done yet;
	// producersChanged is closed, and replaced, when one does.
	pending          map[string]struct{}
	producersChanged chan struct{}
}

func newIPCache(db *statedb.DB, metadata statedb.RWTable[*PrefixMetadata], r *resolver) *IPCache {
	return &IPCache{db: db, metadata: metadata, resolved: r.resolved, entries: r.entries,
		previous: r.previous, live: map[string]*owner{},
		pending: map[string]struct{}{}, producersChanged: make(chan struct{})}
}

// WaitResolved blocks until the resolver has resolved all metadata written
// before the call: the `ipcache` table then has an entry (or the failure to
// resolve one) for every prefix upserted before, and none for a prefix
// removed before. An owner that wants its prefixes to have identities
// before it acts on them (the policy directory, before a policy is in
// force) waits on it. While a prefix waits for the allocator's local
// space (restore after a restart: see RegisterProducer), nothing written
// since is reported resolved.
//
// Possible errors: ctx.Err() when ctx ends first.
func (c *IPCache) WaitResolved(ctx context.Context) error {
	want := c.metadata.Revision(c.db.ReadTxn())
	_, err := c.resolved.Wait(ctx, func(rev statedb.Revision) bool { return rev >= want })
	return err
}

// NewHandle returns the handle of a resource (e.g. "policy/allow-dns"), whose
// metadata has the given source. A resource has no metadata without a
// handle: releasing the handle removes it all, and the table lives in
// memory.
//
// Possible errors:
//   - ErrResourceInUse: the resource has a live handle
//   - ErrTooManyHandles: every resource id is taken by a live handle
//   - ErrInvalidMetadata: the resource name is empty
//   - source.ErrUnknownSource: src is not a valid source
func (c *IPCache) NewHandle(resource string, src source.Source, opts ...HandleOption) (*Handle, error) {
	if resource == "" {
		return nil, fmt.Errorf("create handle: empty resource name: %w", ErrInvalidMetadata)
	}
	if !src.Valid() {
		return nil, fmt.Errorf("create handle for %s: source %s: %w", resource, src, source.ErrUnknownSource)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, taken := c.live[resource]; taken {
		return nil, fmt.Errorf("create handle for %s: %w", resource, ErrResourceInUse)
	}
	o := &owner{resource: resource, source: src}
	for _, opt := range opts {
		opt(o)
	}
	if last := len(c.freeIDs) - 1; last >= 0 {
		o.id, c.freeIDs = c.freeIDs[last], c.freeIDs[:last]
	} else {
		if c.nextID == maxResourceIDs {
			return nil, fmt.Errorf("create handle for %s: %w", resource, ErrTooManyHandles)
		}
		o.id = c.nextID
		c.nextID++
	}
	c.live[resource] = o
	return &Handle{ipcache: c, owner: o, prefixes: map[compactPrefix]struct{}{}, maxKnown: maxKnownPrefixes}, nil
}

// HandleOption changes what a handle's metadata means.
type HandleOption func(*owner)

// SharedIdentity makes the handle's labels the whole label set of its
// prefixes' identity: the prefix's own cidr label is not added, so every
// prefix with the same labels maps to one identity (the addresses learned
// from DNS: one identity per name selector rather than one per address).
// The labels must then hold a cidr label, so that CIDR selectors and the
// world still select the identity: the owner picks the covering prefix
// whose selectors should. A prefix whose rows include one of such a
// handle gets the shared identity.
func SharedIdentity() HandleOption { return func(o *owner) { o.shared = true } }

// RegisterProducer registers a producer of metadata (the policy directory,
// an embedding agent's sources, ...): the `ipcache` table is initialized,
// and reconcilers may prune, only once every registered producer has called
// done and resolution has caught up with what they wrote. Register before
// the hive starts.
//
// A producer that asks for identity numbers by name (RequestedIdentity)
// for prefixes that other owners also assert, as restore does, holds the
// allocator's local space while it speaks (identitycell.Allocator.HoldLocal):
// an owner's row then takes no new number that the request names.
func (c *IPCache) RegisterProducer(name string) (done func()) {
	txn := c.db.WriteTxn(c.metadata)
	markDone := c.metadata.RegisterInitializer(txn, name)
	txn.Commit()
	c.mu.Lock()
	c.pending[name] = struct{}{}
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			txn := c.db.WriteTxn(c.metadata)
			markDone(txn)
			txn.Commit()
			c.mu.Lock()
			delete(c.pending, name)
			close(c.producersChanged)
			c.producersChanged = make(chan struct{})
			c.mu.Unlock()
		})
	}
}

// WaitOtherProducers blocks until every producer registered but name has
// called its done ([IPCache.RegisterProducer]): restore, which speaks
// last for the prefixes no other producer re-asserted, waits for them.
//
// Possible errors: ctx.Err() when ctx ends first.
func (c *IPCache) WaitOtherProducers(ctx context.Context, name string) error {
	for {
		c.mu.Lock()
		_, self := c.pending[name]
		others := len(c.pending)
		if self {
			others--
		}
		changed := c.producersChanged
		c.mu.Unlock()
		if others == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Handle is one resource's ownership of prefix metadata. Its methods are
// safe for concurrent use. Resolution into the `ipcache` table happens
// asynchronously after a method returns.
type Handle struct {
	ipcache *IPCache
	// owner is the resource and source that each of its rows points to.
	owner *owner

	mu       sync.Mutex
	released bool

	// prefixes are those the resource has a row for, while there are at
	// most maxKnown (nil once there were more: see maxKnownPrefixes): the
	// handle is the only writer of its rows, so it knows them, and
	// Release needs them. A statedb index of the table by resource would
	// know them too, at several times the memory per row
	// (docs/SCALE.md). Written under mu, after each commit.
	prefixes map[compactPrefix]struct{}
	maxKnown int
	// numPrefixes is the number of the resource's rows, readable without
	// mu (a gradual release holds mu for minutes); while a release
	// commits a chunk, it is already without the chunk. Written under mu.
	numPrefixes atomic.Int64
}

// NumPrefixes returns the number of prefixes the resource has metadata for.
func (h *Handle) NumPrefixes() int { return int(h.numPrefixes.Load()) }

// Resource returns the handle's resource name.
func (h *Handle) Resource() string { return h.owner.resource }

// Source returns the source of the handle's metadata.
func (h *Handle) Source() source.Source { return h.owner.source }

// PrefixUpsert is one prefix's metadata in a batch.
type PrefixUpsert struct {
	Prefix netip.Prefix
	Metadata
}

// Upsert sets the resource's metadata for a prefix, replacing what the
// resource said of it before. Host bits of the prefix are cleared.
//
// Possible errors: as UpsertBatch.
func (h *Handle) Upsert(prefix netip.Prefix, md Metadata) error {
	return h.UpsertBatch([]PrefixUpsert{{Prefix: prefix, Metadata: md}})
}

// UpsertBatch is Upsert for many prefixes. It validates the whole batch
// first, so an invalid entry writes nothing; large batches are written in
// several transactions.
//
// Possible errors:
//   - ErrInvalidMetadata: an entry's prefix or metadata is invalid; nothing
//     is written
//   - ErrHandleReleased: the handle is released; nothing is written
//   - statedb's write errors (a bug): the chunks before are written
func (h *Handle) UpsertBatch(batch []PrefixUpsert) error {
	for _, u := range batch {
		_, err := canonicalPrefix(u.Prefix)
		if err == nil {
			err = validateMetadata(u.Metadata, h.owner.shared)
		}
		if err != nil {
			return fmt.Errorf("upsert metadata of %s: %w: %w", h.owner.resource, ErrInvalidMetadata, err)
		}
	}
	// The rows are allocated in the order they are written: neighbours in
	// the table's tree are then neighbours in memory, which the index
	// writes, the resolver's read of each prefix's rows and the collector
	// all walk in that order. Allocated in the batch's order, each of
	// those reads was a cache miss on a random row (docs/SCALE.md, issue
	// 38). They are allocated a chunk at a time, as it is written: the
	// first chunk is then committed, and resolved, without waiting for a
	// million rows to be allocated first (at a restart, the resolver
	// meanwhile resolves restore's rows that this batch then replaces:
	// docs/SCALE.md, "Restart, session 36").
	// A position whose metadata is not the zero value is marked, so that
	// only those are read again from the batch: in the batch's order, a
	// random read each (most owners give none).
	order := sortByPrefix(len(batch), func(i int) (netip.Prefix, bool) {
		return batch[i].Prefix.Masked(), batch[i].Metadata != Metadata{}
	})
	rows := make([]*PrefixMetadata, min(len(batch), writeChunkSize))
	var shared sharedLabels
	return h.writeChunked("upsert", len(order), func(txn statedb.WriteTxn, k int) (int, error) {
		if k%writeChunkSize == 0 {
			for j := range rows[:min(len(rows), len(order)-k)] {
				var md Metadata
				if o := order[k+j]; o.marked() {
					md = batch[o.position()].Metadata
				}
				rows[j] = newPrefixMetadata(order[k+j].prefix(), h.owner, shared.of(md.Labels),
					md.RequestedIdentity, md.ExplicitIdentity)
			}
		}
		if _, hadOld, err := h.ipcache.metadata.Insert(txn, rows[k%writeChunkSize]); err != nil || hadOld {
			return 0, err
		}
		return 1, nil
	}, func(k int) {
		h.prefixes[compact(rows[k%writeChunkSize].Prefix())] = struct{}{}
	})
}

// positioned is a batch position's prefix as integers, with no pointer,
// and a mark its caller may set: what sortByPrefix sorts.
type positioned struct {
	hi, lo uint64 // the address, big-endian; IPv4 as IPv4-mapped IPv6
	// tail is the family (IPv6 after IPv4) at bit 63, the mark at bit 62,
	// the length at bits 48-55, then the batch position.
	tail uint64
}

const positionedMark = 1 << 62

func (p positioned) position() int { return int(p.tail & (1<<48 - 1)) }

func (p positioned) marked() bool { return p.tail&positionedMark != 0 }

// prefix returns the prefix, rebuilt from the integers: reading it back
// from a large batch at its position would be a cache miss per prefix.
func (p positioned) prefix() netip.Prefix {
	bits := int(p.tail >> 48 & 0xff)
	if p.tail>>63 == 0 {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(p.lo >> 24), byte(p.lo >> 16), byte(p.lo >> 8), byte(p.lo)}), bits)
	}
	var a [16]byte
	binary.BigEndian.PutUint64(a[:8], p.hi)
	binary.BigEndian.PutUint64(a[8:], p.lo)
	return netip.PrefixFrom(netip.AddrFrom16(a), bits)
}

// sortByPrefix returns the prefixes at the positions 0 to n-1 of a batch
// ordered by prefix, each with its position and the mark prefixAt gave
// it, keeping the batch's order among positions of the same prefix (the
// last one is what the resource says). Written in address order, the
// rows of a large batch share most of the table's tree nodes with their
// neighbours, which makes the writes and their resolution faster, and the
// entries reach the datapath in the order the kernel's LPM trie inserts
// fastest. The batch position breaks ties, so that an unstable sort
// (faster than a stable one) keeps the batch's order.
func sortByPrefix(n int, prefixAt func(int) (netip.Prefix, bool)) []positioned {
	// Sorted by a copy of each prefix as integers, with no pointer: the
	// comparisons read no row and go through no netip, and the sort's
	// swaps need no write barriers (docs/SCALE.md).
	sorted := make([]positioned, n)
	for i := range sorted {
		prefix, mark := prefixAt(i)
		a := prefix.Addr().As16()
		tail := uint64(prefix.Bits())<<48 | uint64(i)
		if prefix.Addr().Is6() {
			tail |= 1 << 63
		}
		if mark {
			tail |= positionedMark
		}
		sorted[i] = positioned{hi: binary.BigEndian.Uint64(a[:8]), lo: binary.BigEndian.Uint64(a[8:]), tail: tail}
	}
	switch {
	case slices.IsSortedFunc(sorted, comparePositioned):
	case n < minRadixSort:
		slices.SortFunc(sorted, comparePositioned)
	default:
		sorted = radixSort(sorted)
	}
	return sorted
}

// comparePositioned orders by family, address, length, then position.
func comparePositioned(a, b positioned) int {
	if a.tail>>63 != b.tail>>63 {
		return cmp.Compare(a.tail>>63, b.tail>>63)
	}
	if a.hi != b.hi {
		return cmp.Compare(a.hi, b.hi)
	}
	if a.lo != b.lo {
		return cmp.Compare(a.lo, b.lo)
	}
	return cmp.Compare(a.tail&^positionedMark, b.tail&^positionedMark)
}

// minRadixSort is the smallest batch sortByPrefix sorts by radix: below
// it, the comparison sort is as fast, and needs no second slice.
const minRadixSort = 1024

// radixSort sorts as comparePositioned does (family, address, length,
// then position), a byte of the key at a time from the least
// significant, each pass stable (so the positions, in order to begin with,
// keep their order). The bytes all keys share are skipped: a batch of
// IPv4 /32s sorts in four passes. A million prefixes sort in a fraction of
// a comparison sort's time, during which nothing else of a large upsert
// can start (docs/SCALE.md, "The owner's sort").
func radixSort(s []positioned) []positioned {
	// A digit is a byte of one of the key's words, at shift: the length
	// (tail's bits 48-55), the address's low then high word, the family
	// (tail's bit 63), from the least significant.
	type digit struct {
		word  int // of words: 0 tail, 1 lo, 2 hi
		shift uint
	}
	digits := []digit{{0, 48}}
	for word := 1; word <= 2; word++ {
		for shift := uint(0); shift < 64; shift += 8 {
			digits = append(digits, digit{word, shift})
		}
	}
	digits = append(digits, digit{0, 63})
	// The bits that differ between keys: only the digits with one need a
	// pass.
	var diff [3]uint64
	for i := range s {
		diff[0] |= s[i].tail ^ s[0].tail
		diff[1] |= s[i].lo ^ s[0].lo
		diff[2] |= s[i].hi ^ s[0].hi
	}
	src, dst := s, make([]positioned, len(s))
	for _, d := range digits {
		if uint8(diff[d.word]>>d.shift) == 0 {
			continue
		}
		key := func(p *positioned) uint8 {
			switch d.word {
			case 1:
				return uint8(p.lo >> d.shift)
			case 2:
				return uint8(p.hi >> d.shift)
			}
			return uint8(p.tail >> d.shift)
		}
		var offsets [256]int
		for i := range src {
			offsets[key(&src[i])]++
		}
		sum := 0
		for b, count := range offsets {
			offsets[b], sum = sum, sum+count
		}
		for i := range src {
			b := key(&src[i])
			dst[offsets[b]] = src[i]
			offsets[b]++
		}
		src, dst = dst, src
	}
	return src
}

func validateMetadata(md Metadata, shared bool) error {
	if md.RequestedIdentity != identity.Unknown && !md.RequestedIdentity.IsLocal() {
		return fmt.Errorf("requested identity %d is not a local identity", md.RequestedIdentity)
	}
	if shared {
		for range md.Labels.Prefixes() {
			return nil
		}
		return fmt.Errorf("a shared identity's labels %q hold no cidr label", md.Labels)
	}
	return nil
}

// Remove removes the resource's metadata for a prefix. Removing what the
// resource does not have is not an error.
//
// Possible errors: as RemoveBatch.
func (h *Handle) Remove(prefix netip.Prefix) error {
	return h.RemoveBatch([]netip.Prefix{prefix})
}

// RemoveBatch is Remove for many prefixes. It validates the whole batch
// first, so an invalid prefix removes nothing.
//
// Possible errors:
//   - ErrInvalidMetadata: a prefix is invalid; nothing is removed
//   - ErrHandleReleased: the handle is released
//   - statedb's write errors (a bug): the chunks before are removed
func (h *Handle) RemoveBatch(prefixes []netip.Prefix) error {
	for _, p := range prefixes {
		if _, err := canonicalPrefix(p); err != nil {
			return fmt.Errorf("remove metadata of %s: %w: %w", h.owner.resource, ErrInvalidMetadata, err)
		}
	}
	order := sortByPrefix(len(prefixes), func(i int) (netip.Prefix, bool) { return prefixes[i].Masked(), false })
	rows := make([]*PrefixMetadata, len(prefixes))
	for k, o := range order {
		rows[k] = newPrefixMetadata(o.prefix(), h.owner, nil, 0, 0)
	}
	return h.writeChunked("remove", len(rows), func(txn statedb.WriteTxn, i int) (int, error) {
		if _, hadOld, err := h.ipcache.metadata.Delete(txn, rows[i]); err != nil || !hadOld {
			return 0, err
		}
		return -1, nil
	}, func(i int) {
		delete(h.prefixes, compact(rows[i].Prefix()))
	})
}

// Release removes all of the resource's metadata and ends the handle; the
// resource may then get a new handle. The rows go in transactions of at
// most releaseChunkSize rows, so that releasing a million prefixes does not
// stall the other owners' writes.
//
// Possible errors:
//   - ErrHandleReleased: the handle is already released
//   - statedb's write errors (a bug): the rows not yet removed and the
//     handle stay
func (h *Handle) Release() error {
	return h.release(context.Background(), nil)
}

// ReleaseGradually is Release at no more than rowsPerSecond rows a second,
// for a large release that nothing waits for (stale prefixes dropped at
// the end of a grace period). Every row deleted is a dead object that statedb's
// graveyard collector removes later, in one write transaction per second
// over all tables, which holds off every writer of the ipcache and
// identities tables meanwhile: released at full speed, a large release
// makes that transaction long. If ctx ends first (or its
// deadline comes before the next chunk's turn), the rows not yet removed
// and the handle stay, and an error says so.
//
// Possible errors:
//   - ErrHandleReleased: the handle is already released
//   - ctx.Err(), or the limiter's error when ctx's deadline comes before
//     the next chunk's turn: the rows not yet removed and the handle stay
//   - statedb's write errors (a bug), as for Release
func (h *Handle) ReleaseGradually(ctx context.Context, rowsPerSecond int) error {
	return h.release(ctx, rate.NewLimiter(rate.Limit(rowsPerSecond), releaseChunkSize))
}

// release removes the resource's rows, a chunk per transaction, each chunk
// first waiting for the limiter (if any). The rows go in address order,
// as batches are written (see sortByPrefix).
func (h *Handle) release(ctx context.Context, limiter *rate.Limiter) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return fmt.Errorf("release %s: %w", h.owner.resource, ErrHandleReleased)
	}
	c := h.ipcache
	next := h.releaseChunks()
	for chunk := next(); len(chunk) > 0; chunk = next() {
		if limiter != nil {
			if err := limiter.WaitN(ctx, len(chunk)); err != nil {
				return fmt.Errorf("release %s: %w", h.owner.resource, err)
			}
		}
		txn := c.db.WriteTxn(c.metadata)
		for _, prefix := range chunk {
			if _, _, err := c.metadata.Delete(txn, newPrefixMetadata(prefix, h.owner, nil, 0, 0)); err != nil {
				txn.Abort()
				return fmt.Errorf("release %s: %w", h.owner.resource, err)
			}
		}
		// The count drops before the rows go: whoever sees them gone (a
		// status that calls the release over at zero) sees it too.
		h.numPrefixes.Add(-int64(len(chunk)))
		txn.Commit()
		if h.prefixes != nil {
			for _, prefix := range chunk {
				delete(h.prefixes, compact(prefix))
			}
		}
	}
	h.released = true

	// Every row of the resource is deleted: a later handle, of this
	// resource or another, can have its id. A row inserted at the key of
	// a deleted row that the resolver has not seen go yet replaces that
	// deletion in statedb's graveyard: the resolver sees the prefix change
	// either way, and resolves it from the rows it then has.
	c.mu.Lock()
	delete(c.live, h.owner.resource)
	c.freeIDs = append(c.freeIDs, h.owner.id)
	c.mu.Unlock()
	return nil
}

// releaseChunks returns a function that gives the resource's prefixes in
// address order, at most releaseChunkSize at a time, and none once all are
// given: from the handle's set, or when it keeps none, from a scan of the
// table that goes a chunk at a time (the handle is the only writer of its
// rows, and holds mu). A scan of the whole table up front would take its
// CPU at once and keep every prefix alive until a paced release ends.
func (h *Handle) releaseChunks() func() []netip.Prefix {
	if h.prefixes != nil {
		prefixes := make([]netip.Prefix, 0, len(h.prefixes))
		for key := range h.prefixes {
			prefixes = append(prefixes, key.prefix())
		}
		slices.SortFunc(prefixes, prefixkey.Compare)
		return func() []netip.Prefix {
			chunk := prefixes[:min(releaseChunkSize, len(prefixes))]
			prefixes = prefixes[len(chunk):]
			return chunk
		}
	}
	c := h.ipcache
	var (
		from  netip.Prefix // the last prefix given: its other rows are not the resource's
		done  bool
		chunk = make([]netip.Prefix, 0, releaseChunkSize)
	)
	return func() []netip.Prefix {
		chunk = chunk[:0]
		if done {
			return chunk
		}
		rows := c.metadata.All(c.db.ReadTxn())
		if from.IsValid() {
			rows = c.metadata.LowerBound(c.db.ReadTxn(), MetadataIndex.Query(from))
		}
		done = true
		for row := range rows {
			if row.owner.id != h.owner.id {
				continue
			}
			if len(chunk) == releaseChunkSize {
				done = false
				break
			}
			chunk = append(chunk, row.Prefix())
		}
		if len(chunk) > 0 {
			from = chunk[len(chunk)-1]
		}
		return chunk
	}
}

// writeChunked calls write for 0..n-1, committing every writeChunkSize;
// after each commit, written for each row of the chunk while the handle
// keeps its set of prefixes. write returns by how much the resource's
// rows changed in number (-1, 0 or 1). verb names the operation in errors.
func (h *Handle) writeChunked(verb string, n int, write func(statedb.WriteTxn, int) (int, error), written func(int)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return fmt.Errorf("%s metadata of %s: %w", verb, h.owner.resource, ErrHandleReleased)
	}
	c := h.ipcache
	for start := 0; start < n; start += writeChunkSize {
		end := min(start+writeChunkSize, n)
		txn := c.db.WriteTxn(c.metadata)
		added := 0
		for i := start; i < end; i++ {
			delta, err := write(txn, i)
			if err != nil {
				txn.Abort()
				return fmt.Errorf("%s metadata of %s: %w", verb, h.owner.resource, err)
			}
			added += delta
		}
		txn.Commit()
		count := h.numPrefixes.Add(int64(added))
		if h.prefixes != nil && count > int64(h.maxKnown) {
			h.prefixes = nil // found by a scan from now on
		}
		if h.prefixes != nil {
			for i := start; i < end; i++ {
				written(i)
			}
		}
	}
	return nil
}
