// SPDX-License-Identifier: Apache-2.0

package fqdn

import (
	"cmp"
	"maps"
	"math"
	"net/netip"
	"slices"
	"time"
)

// Config is the cache's retention and its bounds. A zero field takes its
// default (DefaultConfig).
type Config struct {
	// MinTTL is the least time a learned address is live, whatever the
	// answer's TTL (--tofqdns-min-ttl).
	MinTTL time.Duration
	// IdleGrace is how long an expired address is kept after it was last
	// in use (or expired), when no connection uses it any more
	// (--tofqdns-idle-connection-grace-period).
	IdleGrace time.Duration
	// MaxAddressesPerName is the most live addresses of one name
	// (--tofqdns-endpoint-max-ip-per-hostname): a new one makes the
	// soonest to expire deferred.
	MaxAddressesPerName int
	// MaxDeferred is the most deferred name-address pairs: expired, or
	// made deferred by a cap, and kept while in use
	// (--tofqdns-max-deferred-connection-deletes). Past it, the one in
	// use longest ago is removed.
	MaxDeferred int
	// MaxLive is the most live name-address pairs of all names: a new
	// one makes the soonest to expire deferred. Cilium has no such
	// bound; it is what bounds the memory of a flood of fresh names.
	MaxLive int
}

// DefaultConfig returns the configuration a zero field takes: Cilium's
// flags' defaults, and MaxLive 131072.
func DefaultConfig() Config {
	return Config{
		MaxAddressesPerName: 1000,
		MaxDeferred:         10000,
		MaxLive:             1 << 17,
	}
}

// maxPairs bounds MaxLive and MaxDeferred.
const maxPairs = 1 << 30

func (c Config) withDefaults() Config {
	defaults := DefaultConfig()
	if c.MaxAddressesPerName <= 0 {
		c.MaxAddressesPerName = defaults.MaxAddressesPerName
	}
	if c.MaxDeferred <= 0 {
		c.MaxDeferred = defaults.MaxDeferred
	}
	if c.MaxLive <= 0 {
		c.MaxLive = defaults.MaxLive
	}
	// A heap index is an int32.
	c.MaxLive = min(c.MaxLive, maxPairs)
	c.MaxDeferred = min(c.MaxDeferred, maxPairs)
	c.MinTTL = max(c.MinTTL, 0)
	c.IdleGrace = max(c.IdleGrace, 0)
	return c
}

// Entry is a name-address pair the cache holds.
type Entry struct {
	// Name is canonical ([CanonicalName]).
	Name string
	Addr netip.Addr
	// Expires is when the answer's TTL (at least MinTTL) ends, in UTC.
	Expires time.Time
	// Deferred is set once the pair expired or a cap made it give way:
	// it is kept while a connection uses the address, and IdleGrace
	// after.
	Deferred bool
}

// Removed is a pair the cache no longer holds.
type Removed struct {
	Entry
	// Last is set when no name holds Addr any more: whatever the caller
	// allowed for the address goes with it.
	Last bool
}

// Update is what an Add or Restore changed.
type Update struct {
	// Added are the pairs the cache did not hold before: live, or for
	// Restore deferred when their expiry has passed.
	Added []Entry
	// Removed are the deferred pairs removed to stay within MaxDeferred.
	// Last is as it stands once the whole call is done.
	Removed []Removed
	// Deferred counts the live pairs made deferred to stay within
	// MaxAddressesPerName and MaxLive.
	Deferred int
}

// Cache holds the names learned from DNS answers and their addresses,
// each pair live until its TTL ends, then deferred while the caller says
// a connection uses the address. Its memory is bounded by MaxLive plus
// MaxDeferred pairs.
//
// A Cache is not safe for concurrent use: its owner serializes calls.
type Cache struct {
	cfg   Config
	now   func() time.Time
	names map[string]*nameEntries
	addrs map[netip.Addr][]*entry
	// live is ordered by expiry, deferred by last use: the next to
	// expire and the first to give way are at the top.
	live     entryHeap
	deferred entryHeap
	// The maps' largest sizes since they were last copied (shrinkMaps).
	peakNames, peakAddrs int
}

// entry is a pair. The name shares the names map key's bytes.
type entry struct {
	name     string
	addr     netip.Addr
	expires  int64 // Unix nanoseconds
	lastUsed int64 // Unix nanoseconds; deferred entries only
	index    int32 // in live or deferred
	slot     int32 // in its name's entries
	deferred bool
}

// NewCache returns an empty cache that reads the time from now (time.Now
// when nil).
func NewCache(cfg Config, now func() time.Time) *Cache {
	if now == nil {
		now = time.Now
	}
	return &Cache{
		cfg:   cfg.withDefaults(),
		now:   now,
		names: make(map[string]*nameEntries),
		addrs: make(map[netip.Addr][]*entry),
	}
}

// Config returns the cache's configuration, defaults filled in.
func (c *Cache) Config() Config { return c.cfg }

// Add records that the answer's question name resolves to each of its
// addresses, as Cilium does: the question name learns them, whichever
// name of the CNAME chain the records are under. A pair already held
// keeps the later of its expiries and is live again if it was deferred.
// A name no selector can match (a character other than letters, digits,
// '-' and '_' in a label, an empty label, the root) learns nothing.
func (c *Cache) Add(answer Answer) Update {
	var u Update
	if len(answer.Addresses) == 0 {
		return u
	}
	name := CanonicalName(answer.Question)
	if !validName(name) {
		return u
	}
	now := c.now().UnixNano()
	for _, a := range answer.Addresses {
		if !a.Addr.IsValid() {
			continue
		}
		ttl := max(time.Duration(clampTTL(a.TTL))*time.Second, c.cfg.MinTTL)
		c.learn(name, a.Addr.Unmap(), addNanos(now, ttl), now, &u)
	}
	c.netChange(&u)
	c.settleLast(u.Removed)
	return u
}

// Restore puts back pairs from a checkpoint ([ReadCheckpoint]): live
// until their expiry, or deferred from now when it has passed, so that a
// connection that outlived the agent is seen by the next GC. The caps
// apply as for Add; Update.Added lists the deferred pairs restored too.
func (c *Cache) Restore(entries []Entry) Update {
	var u Update
	now := c.now().UnixNano()
	for _, e := range entries {
		if !e.Addr.IsValid() {
			continue
		}
		name, addr, expires := CanonicalName(e.Name), e.Addr.Unmap(), unixNanos(e.Expires)
		if !validName(name) {
			continue
		}
		if expires > now {
			c.learn(name, addr, expires, now, &u)
			continue
		}
		ne := c.names[name]
		if ne.find(addr) != nil {
			continue
		}
		if ne == nil {
			ne = &nameEntries{}
			c.names[name] = ne
		}
		held := &entry{name: name, addr: addr, expires: expires, lastUsed: now, deferred: true}
		c.insert(ne, held)
		c.deferred.push(held, held.lastUsed)
		u.Added = append(u.Added, held.export())
		c.trimDeferred(&u)
	}
	c.netChange(&u)
	c.settleLast(u.Removed)
	return u
}

// learn records name -> addr live until expires.
func (c *Cache) learn(name string, addr netip.Addr, expires, now int64, u *Update) {
	ne := c.names[name]
	if e := ne.find(addr); e != nil {
		e.expires = max(e.expires, expires)
		if !e.deferred {
			c.live.fix(int(e.index), e.expires)
			return
		}
		c.deferred.remove(int(e.index))
		c.makeRoom(ne, now, u) // while e is in no heap, and still not live
		ne.setLive(e)
		e.deferred, e.lastUsed = false, 0
		c.live.push(e, e.expires)
		c.trimDeferred(u)
		return
	}
	if ne == nil {
		ne = &nameEntries{}
		c.names[name] = ne
	}
	c.makeRoom(ne, now, u)
	e := &entry{name: name, addr: addr, expires: expires}
	c.insert(ne, e)
	c.live.push(e, e.expires)
	u.Added = append(u.Added, e.export())
	// Only now: the name holds e, so removing its deferred pairs cannot
	// leave it empty and forgotten.
	c.trimDeferred(u)
}

// insert adds a new entry to its name and its address, in no heap yet.
func (c *Cache) insert(ne *nameEntries, e *entry) {
	e.index = -1
	ne.add(e)
	c.addrs[e.addr] = append(c.addrs[e.addr], e)
	c.peakNames = max(c.peakNames, len(c.names))
	c.peakAddrs = max(c.peakAddrs, len(c.addrs))
}

// makeRoom makes a live pair deferred when the name or the cache is at
// its cap, the soonest to expire first.
func (c *Cache) makeRoom(ne *nameEntries, now int64, u *Update) {
	if ne.live >= c.cfg.MaxAddressesPerName {
		if soonest := ne.soonestLive(); soonest != nil {
			c.live.remove(int(soonest.index))
			c.makeDeferred(soonest, now, u)
		}
	}
	if c.live.len() >= c.cfg.MaxLive {
		c.makeDeferred(c.live.pop(), now, u)
	}
}

// makeDeferred moves an entry already out of live to deferred, last used
// at now.
func (c *Cache) makeDeferred(e *entry, now int64, u *Update) {
	c.names[e.name].setDeferred(e)
	e.deferred = true
	e.lastUsed = now
	c.deferred.push(e, now)
	u.Deferred++
}

// trimDeferred removes the deferred pairs used longest ago while there
// are more than MaxDeferred.
func (c *Cache) trimDeferred(u *Update) {
	for c.deferred.len() > c.cfg.MaxDeferred {
		e := c.deferred.pop()
		u.Removed = append(u.Removed, c.forget(e))
	}
}

// GC makes the live pairs whose expiry has passed deferred, then removes
// the deferred pairs whose address inUse does not report in use (nil:
// none is) and whose last use (or expiry) is IdleGrace or more ago, and
// returns them. A deferred pair in use is kept, and its last use is now,
// unless there are more than MaxDeferred: then those used longest ago
// are removed too. Of the pairs removed of an address, the last one in
// the list says Last when no name holds the address any more.
func (c *Cache) GC(inUse func(netip.Addr) bool) []Removed {
	now := c.now().UnixNano()
	// The expired pairs join the deferred ones unordered: the loop
	// below sets their keys and orders them all once.
	for c.live.len() > 0 && c.live.top().expires <= now {
		e := c.live.pop()
		c.names[e.name].setDeferred(e)
		e.deferred = true
		e.lastUsed = e.expires
		c.deferred.slots = append(c.deferred.slots, heapSlot{e: e})
	}
	var removed []Removed
	kept := c.deferred.slots[:0]
	var gone []*entry
	for _, slot := range c.deferred.slots {
		e := slot.e
		switch {
		case inUse != nil && inUse(e.addr):
			e.lastUsed = now
		case addNanos(e.lastUsed, c.cfg.IdleGrace) <= now:
			gone = append(gone, e)
			continue
		}
		kept = append(kept, heapSlot{e.lastUsed, e})
	}
	clear(c.deferred.slots[len(kept):])
	c.deferred.slots = kept
	c.deferred.init()
	c.deferred.shrink()
	for _, e := range gone {
		e.index = -1
		removed = append(removed, c.forget(e))
	}
	// The cap holds even against pairs in use: the ones used longest
	// ago give way, as Cilium's deferred deletes do.
	var u Update
	c.trimDeferred(&u)
	removed = append(removed, u.Removed...)
	c.settleLast(removed)
	c.shrinkMaps()
	return removed
}

// shrinkMaps copies the maps into new ones once they hold a quarter of
// what they held at their largest: a Go map keeps its largest size's
// memory, so without this a burst of names would stay in memory for
// good.
func (c *Cache) shrinkMaps() {
	// Copied entry by entry: maps.Clone keeps the source's size.
	if c.peakNames > 1024 && len(c.names) < c.peakNames/4 {
		names := make(map[string]*nameEntries, len(c.names))
		maps.Copy(names, c.names)
		c.names, c.peakNames = names, len(names)
	}
	if c.peakAddrs > 1024 && len(c.addrs) < c.peakAddrs/4 {
		addrs := make(map[netip.Addr][]*entry, len(c.addrs))
		maps.Copy(addrs, c.addrs)
		c.addrs, c.peakAddrs = addrs, len(addrs)
	}
}

type pairKey struct {
	name string
	addr netip.Addr
}

// netChange leaves in Added the pairs held now and not before the call,
// and in Removed those held before and not now: a pair removed and
// learned again in one call (a cap made it give way to another address
// of the same answer), or learned and removed, is in neither.
func (c *Cache) netChange(u *Update) {
	if len(u.Added) == 0 || len(u.Removed) == 0 {
		return
	}
	adds, removes := make(map[pairKey]int), make(map[pairKey]int)
	for _, e := range u.Added {
		adds[pairKey{e.Name, e.Addr}]++
	}
	for _, r := range u.Removed {
		removes[pairKey{r.Name, r.Addr}]++
	}
	keepAdded, keepRemoved := make(map[pairKey]bool), make(map[pairKey]bool)
	for k, removes := range removes {
		adds := adds[k]
		if adds == 0 {
			continue
		}
		// A pair's adds and removes alternate: held before the call when
		// the removes outnumber the adds by one more than it is held now.
		heldNow := c.find(k.name, k.addr) != nil
		heldBefore := removes-adds+boolInt(heldNow) == 1
		keepAdded[k] = heldNow && !heldBefore
		keepRemoved[k] = heldBefore && !heldNow
	}
	u.Added = slices.DeleteFunc(u.Added, func(e Entry) bool {
		k := pairKey{e.Name, e.Addr}
		keep, decided := keepAdded[k]
		if !decided {
			return false
		}
		keepAdded[k] = false // the first one only
		return !keep
	})
	for i := len(u.Removed) - 1; i >= 0; i-- {
		k := pairKey{u.Removed[i].Name, u.Removed[i].Addr}
		keep, decided := keepRemoved[k]
		if !decided {
			continue
		}
		keepRemoved[k] = false // the last one only
		if !keep {
			u.Removed[i].Name = ""
		}
	}
	u.Removed = slices.DeleteFunc(u.Removed, func(r Removed) bool { return r.Name == "" })
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// settleLast sets Last on the last removal of each address that no name
// holds once the whole call is done, and clears it on the others: an
// address removed for one name may be learned for another later in the
// same call.
func (c *Cache) settleLast(removed []Removed) {
	if len(removed) == 0 {
		return
	}
	seen := make(map[netip.Addr]bool, len(removed))
	for i := len(removed) - 1; i >= 0; i-- {
		addr := removed[i].Addr
		removed[i].Last = !seen[addr] && len(c.addrs[addr]) == 0
		seen[addr] = true
	}
}

// forget removes an entry that is in neither heap any more.
func (c *Cache) forget(e *entry) Removed {
	if c.names[e.name].remove(e) {
		delete(c.names, e.name)
	}
	holders := deleteEntry(c.addrs[e.addr], e)
	if len(holders) == 0 {
		delete(c.addrs, e.addr)
	} else {
		c.addrs[e.addr] = holders
	}
	return Removed{Entry: e.export(), Last: len(holders) == 0}
}

// deleteEntry removes e from entries, not keeping the order, and returns
// nil once empty so that no backing array outlives its entries.
func deleteEntry(entries []*entry, e *entry) []*entry {
	i := slices.Index(entries, e)
	if i < 0 {
		return entries
	}
	last := len(entries) - 1
	entries[i] = entries[last]
	entries[last] = nil
	if last == 0 {
		return nil
	}
	return entries[:last]
}

func (c *Cache) find(name string, addr netip.Addr) *entry {
	return c.names[name].find(addr)
}

func (e *entry) export() Entry {
	return Entry{Name: e.name, Addr: e.addr, Expires: time.Unix(0, e.expires).UTC(), Deferred: e.deferred}
}

// Addresses returns the addresses, live and deferred, of the names m
// matches, sorted, each once.
func (c *Cache) Addresses(m Matcher) []netip.Addr {
	var out []netip.Addr
	for name, ne := range c.names {
		if !m.Match(name) {
			continue
		}
		for _, e := range ne.entries {
			out = append(out, e.addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// NamesOf returns the names that hold addr, sorted: the caller matches
// them against its selectors to know which still select the address.
func (c *Cache) NamesOf(addr netip.Addr) []string {
	holders := c.addrs[addr.Unmap()]
	out := make([]string, 0, len(holders))
	for _, e := range holders {
		out = append(out, e.name)
	}
	slices.Sort(out)
	return out
}

// Entries returns every pair, by name then address.
func (c *Cache) Entries() []Entry {
	out := make([]Entry, 0, c.live.len()+c.deferred.len())
	for _, ne := range c.names {
		for _, e := range ne.entries {
			out = append(out, e.export())
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), a.Addr.Compare(b.Addr))
	})
	return out
}

// Stats are the cache's sizes.
type Stats struct {
	Names     int // names with at least one pair
	Addresses int // distinct addresses
	Live      int // live pairs
	Deferred  int // deferred pairs
}

// Stats returns the cache's sizes.
func (c *Cache) Stats() Stats {
	return Stats{Names: len(c.names), Addresses: len(c.addrs), Live: c.live.len(), Deferred: c.deferred.len()}
}

// addNanos adds d to t (Unix nanoseconds), saturating instead of
// overflowing: a huge TTL or grace means "for ever", not the past.
func addNanos(t int64, d time.Duration) int64 {
	if d > 0 && t > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return t + int64(d)
}

// unixNanos is t in Unix nanoseconds, saturating outside the years
// 1678-2262 that an int64 holds.
func unixNanos(t time.Time) int64 {
	switch {
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	}
	return t.UnixNano()
}

// entryHeap is a min-heap of entries by a key kept beside each entry, so
// that ordering reads no entry, and each entry knows its index.
type entryHeap struct {
	slots []heapSlot
}

type heapSlot struct {
	key int64
	e   *entry
}

func (h *entryHeap) len() int { return len(h.slots) }

// top is the entry with the least key; the heap is not empty.
func (h *entryHeap) top() *entry { return h.slots[0].e }

func (h *entryHeap) push(e *entry, key int64) {
	h.slots = append(h.slots, heapSlot{key, e})
	h.up(len(h.slots) - 1)
}

// pop removes the entry with the least key; the heap is not empty.
func (h *entryHeap) pop() *entry { return h.remove(0) }

// remove removes the entry at index i.
func (h *entryHeap) remove(i int) *entry {
	e := h.slots[i].e
	last := len(h.slots) - 1
	if i != last {
		h.swap(i, last)
	}
	h.slots[last] = heapSlot{}
	h.slots = h.slots[:last]
	if i != last {
		h.fix(i, h.slots[i].key)
	}
	e.index = -1
	h.shrink()
	return e
}

// fix sets the key of the entry at index i and restores the order.
func (h *entryHeap) fix(i int, key int64) {
	h.slots[i].key = key
	if !h.down(i) {
		h.up(i)
	}
}

// init orders slots built in any order.
func (h *entryHeap) init() {
	for i := range h.slots {
		h.slots[i].e.index = int32(i)
	}
	for i := len(h.slots)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *entryHeap) swap(i, j int) {
	h.slots[i], h.slots[j] = h.slots[j], h.slots[i]
	h.slots[i].e.index = int32(i)
	h.slots[j].e.index = int32(j)
}

func (h *entryHeap) up(i int) {
	h.slots[i].e.index = int32(i)
	for i > 0 {
		parent := (i - 1) / 2
		if h.slots[parent].key <= h.slots[i].key {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

// down moves the entry at i down to its place, and reports whether it
// moved.
func (h *entryHeap) down(i int) bool {
	start := i
	n := len(h.slots)
	for {
		least := 2*i + 1
		if least >= n {
			break
		}
		if right := least + 1; right < n && h.slots[right].key < h.slots[least].key {
			least = right
		}
		if h.slots[i].key <= h.slots[least].key {
			break
		}
		h.swap(i, least)
		i = least
	}
	return i > start
}

// shrink gives back the array once most of it is unused, so that a burst
// leaves no large array behind.
func (h *entryHeap) shrink() {
	if cap(h.slots) > 64 && len(h.slots) < cap(h.slots)/4 {
		// A new array: a slice of the old one, even empty, keeps it.
		h.slots = append(make([]heapSlot, 0, len(h.slots)), h.slots...)
	}
}

// Holds reports whether the cache holds a pair of the name (canonical).
func (c *Cache) Holds(name string) bool {
	_, ok := c.names[name]
	return ok
}
