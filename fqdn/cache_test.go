// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// clock is a settable time for a cache.
type clock struct{ t time.Time }

func newClock() *clock { return &clock{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) now() time.Time { return c.t }

func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func answerOf(name string, ttl uint32, addrs ...string) fqdn.Answer {
	a := fqdn.Answer{Question: name}
	for _, s := range addrs {
		a.Addresses = append(a.Addresses, fqdn.Address{Name: name, Addr: netip.MustParseAddr(s), TTL: ttl})
	}
	return a
}

func pairs(entries []fqdn.Entry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name+" "+e.Addr.String())
	}
	return out
}

func removedPairs(removed []fqdn.Removed) []string {
	var out []string
	for _, r := range removed {
		out = append(out, fmt.Sprintf("%s %s last=%v", r.Name, r.Addr, r.Last))
	}
	slices.Sort(out)
	return out
}

func inUse(addrs ...string) func(netip.Addr) bool {
	set := make(map[netip.Addr]bool)
	for _, s := range addrs {
		set[netip.MustParseAddr(s)] = true
	}
	return func(a netip.Addr) bool { return set[a] }
}

func TestCacheTTLAndMinTTL(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{MinTTL: 10 * time.Second}, clk.now)

	u := c.Add(answerOf("API.example.com.", 30, "192.0.2.1", "::ffff:192.0.2.2"))
	require.Equal(t, []string{"api.example.com 192.0.2.1", "api.example.com 192.0.2.2"}, pairs(u.Added))
	require.Equal(t, clk.now().Add(30*time.Second), u.Added[0].Expires)
	u = c.Add(answerOf("b.example.com", 2, "192.0.2.1")) // below MinTTL
	require.Equal(t, clk.now().Add(10*time.Second), u.Added[0].Expires)
	// Learning a pair again keeps the later expiry and adds nothing.
	u = c.Add(answerOf("api.example.com", 1, "192.0.2.1"))
	require.Empty(t, u.Added)
	require.Equal(t, fqdn.Stats{Names: 2, Addresses: 2, Live: 3}, c.Stats())

	clk.advance(10 * time.Second)
	removed := c.GC(nil)
	require.Equal(t, []string{"b.example.com 192.0.2.1 last=false"}, removedPairs(removed))
	require.Equal(t, []string{"api.example.com"}, c.NamesOf(netip.MustParseAddr("192.0.2.1")))

	clk.advance(20 * time.Second)
	removed = c.GC(nil)
	require.Equal(t, []string{"api.example.com 192.0.2.1 last=true", "api.example.com 192.0.2.2 last=true"}, removedPairs(removed))
	require.Equal(t, fqdn.Stats{}, c.Stats())
}

func TestCacheKeptWhileInUseThenGrace(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{IdleGrace: 5 * time.Second}, clk.now)
	c.Add(answerOf("a.example.com", 10, "192.0.2.1", "192.0.2.2"))

	clk.advance(11 * time.Second)
	// Expired a second ago: within the grace, in use or not.
	require.Empty(t, c.GC(inUse("192.0.2.1")))
	require.Equal(t, fqdn.Stats{Names: 1, Addresses: 2, Deferred: 2}, c.Stats())
	for _, e := range c.Entries() {
		require.True(t, e.Deferred)
	}

	clk.advance(4 * time.Second) // 5s after expiry: .2 goes, .1 is in use
	require.Equal(t, []string{"a.example.com 192.0.2.2 last=true"}, removedPairs(c.GC(inUse("192.0.2.1"))))

	clk.advance(time.Hour) // still in use
	require.Empty(t, c.GC(inUse("192.0.2.1")))
	clk.advance(4 * time.Second) // idle for less than the grace
	require.Empty(t, c.GC(nil))
	// Learned again: live, and not added (it was held all along).
	u := c.Add(answerOf("a.example.com", 60, "192.0.2.1"))
	require.Empty(t, u.Added)
	require.Equal(t, fqdn.Stats{Names: 1, Addresses: 1, Live: 1}, c.Stats())
	clk.advance(60 * time.Second)
	require.Empty(t, c.GC(nil)) // expired now: grace from the expiry
	clk.advance(5 * time.Second)
	require.Equal(t, []string{"a.example.com 192.0.2.1 last=true"}, removedPairs(c.GC(nil)))
}

func TestCacheNoGraceExpiresAtTTL(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{}, clk.now)
	c.Add(answerOf("a.example.com", 0, "192.0.2.1"))
	require.Len(t, c.GC(nil), 1)
}

func TestCachePerNameCap(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{MaxAddressesPerName: 2}, clk.now)
	c.Add(answerOf("s3.example.com", 30, "192.0.2.1"))
	c.Add(answerOf("s3.example.com", 10, "192.0.2.2"))
	u := c.Add(answerOf("s3.example.com", 20, "192.0.2.3"))
	// The soonest to expire, .2, gives way: deferred, kept while in use.
	require.Equal(t, 1, u.Deferred)
	require.Equal(t, fqdn.Stats{Names: 1, Addresses: 3, Live: 2, Deferred: 1}, c.Stats())
	require.Equal(t, []string{"s3.example.com 192.0.2.2"}, pairs(deferredOf(c)))
	require.Empty(t, c.GC(inUse("192.0.2.2")))
	require.Equal(t, []string{"s3.example.com 192.0.2.2 last=true"}, removedPairs(c.GC(nil)))
	// Other names have their own cap.
	c.Add(answerOf("other.example.com", 5, "192.0.2.1", "192.0.2.9"))
	require.Equal(t, 4, c.Stats().Live)
}

func deferredOf(c *fqdn.Cache) []fqdn.Entry {
	var out []fqdn.Entry
	for _, e := range c.Entries() {
		if e.Deferred {
			out = append(out, e)
		}
	}
	return out
}

func TestCacheLiveAndDeferredCaps(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{MaxLive: 3, MaxDeferred: 2}, clk.now)
	for i := range 3 {
		c.Add(answerOf(fmt.Sprintf("n%d.example.com", i), uint32(100-i), fmt.Sprintf("192.0.2.%d", i)))
	}
	// n2 expires soonest: it gives way to n3.
	u := c.Add(answerOf("n3.example.com", 100, "192.0.2.3"))
	require.Equal(t, 1, u.Deferred)
	require.Equal(t, []string{"n2.example.com 192.0.2.2"}, pairs(deferredOf(c)))
	clk.advance(time.Second)
	c.Add(answerOf("n4.example.com", 100, "192.0.2.4")) // n1 gives way
	clk.advance(time.Second)
	// n0 gives way, and the deferred one used longest ago (n2) is removed.
	u = c.Add(answerOf("n5.example.com", 100, "192.0.2.5"))
	require.Equal(t, []string{"n2.example.com 192.0.2.2 last=true"}, removedPairs(u.Removed))
	require.Equal(t, fqdn.Stats{Names: 5, Addresses: 5, Live: 3, Deferred: 2}, c.Stats())
}

func TestCacheAddressesBySelector(t *testing.T) {
	c := fqdn.NewCache(fqdn.Config{}, newClock().now)
	c.Add(answerOf("api.example.com", 60, "192.0.2.1", "2001:db8::1"))
	c.Add(answerOf("www.example.com", 60, "192.0.2.1", "192.0.2.2"))
	c.Add(answerOf("a.b.example.com", 60, "192.0.2.3"))
	c.Add(answerOf("x y.example.com", 60, "192.0.2.4")) // no selector matches it: not learned
	c.Add(answerOf(".", 60, "192.0.2.4"))
	c.Add(fqdn.Answer{Question: "empty.example.com"})

	match := func(sel fqdn.Selector) []string {
		m, err := sel.Compile()
		require.NoError(t, err)
		var out []string
		for _, a := range c.Addresses(m) {
			out = append(out, a.String())
		}
		return out
	}
	require.Equal(t, []string{"192.0.2.1", "2001:db8::1"}, match(fqdn.Selector{MatchName: "API.example.com."}))
	require.Equal(t, []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"}, match(fqdn.Selector{MatchPattern: "*.example.com"}))
	require.Equal(t, []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::1"}, match(fqdn.Selector{MatchPattern: "*"}))
	require.Empty(t, match(fqdn.Selector{MatchName: "example.com"}))
	require.Equal(t, []string{"api.example.com", "www.example.com"}, c.NamesOf(netip.MustParseAddr("192.0.2.1")))
	require.Empty(t, c.NamesOf(netip.MustParseAddr("192.0.2.4")))
}

// TestCacheAgainstModel runs random operations against the cache and a
// plain model of the same rules (TTL, MinTTL, in use, grace, learned
// again), with caps the operations never reach, and compares everything.
func TestCacheAgainstModel(t *testing.T) {
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 1))
		clk := newClock()
		cfg := fqdn.Config{MinTTL: time.Duration(rng.IntN(3)) * time.Second, IdleGrace: time.Duration(rng.IntN(4)) * time.Second}
		c := fqdn.NewCache(cfg, clk.now)
		m := newModel(cfg)
		names := []string{"a.example.com", "b.example.com", "c.example.com", "d.example.com"}
		// Enough addresses that a name indexes its pairs.
		addrs := []string{"2001:db8::1", "2001:db8::2"}
		for i := range 22 {
			addrs = append(addrs, fmt.Sprintf("192.0.2.%d", i))
		}
		for op := range 2000 {
			switch rng.IntN(4) {
			case 0, 1:
				a := fqdn.Answer{Question: names[rng.IntN(len(names))]}
				for _, i := range rng.Perm(len(addrs))[:1+rng.IntN(8)] {
					a.Addresses = append(a.Addresses, fqdn.Address{Addr: netip.MustParseAddr(addrs[i]), TTL: uint32(rng.IntN(6))})
				}
				got := c.Add(a)
				want := m.add(a, clk.now())
				require.Equal(t, want, sortedPairs(got.Added), "seed %d op %d add", seed, op)
				require.Empty(t, got.Removed)
			case 2:
				clk.advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
			case 3:
				used := make(map[netip.Addr]bool)
				for _, s := range addrs {
					used[netip.MustParseAddr(s)] = rng.IntN(3) == 0
				}
				inUse := func(a netip.Addr) bool { return used[a] }
				removed := c.GC(inUse)
				want := m.gc(clk.now(), inUse)
				require.Equal(t, want, sortedPairs(entriesOf(removed)), "seed %d op %d gc", seed, op)
				checkLast(t, c, removed)
			}
			require.Equal(t, m.entries(), c.Entries(), "seed %d op %d", seed, op)
			a := netip.MustParseAddr(addrs[rng.IntN(len(addrs))])
			require.Equal(t, m.namesOf(a), c.NamesOf(a))
		}
	}
}

func sortedPairs(entries []fqdn.Entry) []string {
	out := pairs(entries)
	slices.Sort(out)
	return out
}

type modelKey struct {
	name string
	addr netip.Addr
}

type modelEntry struct {
	expires, lastUsed time.Time
	deferred          bool
}

type model struct {
	cfg   fqdn.Config
	pairs map[modelKey]*modelEntry
}

func newModel(cfg fqdn.Config) *model { return &model{cfg, make(map[modelKey]*modelEntry)} }

func (m *model) add(a fqdn.Answer, now time.Time) []string {
	var added []string
	for _, addr := range a.Addresses {
		k := modelKey{fqdn.CanonicalName(a.Question), addr.Addr}
		expires := now.Add(max(time.Duration(addr.TTL)*time.Second, m.cfg.MinTTL))
		if e, ok := m.pairs[k]; ok {
			if expires.After(e.expires) {
				e.expires = expires
			}
			e.deferred = false
			continue
		}
		m.pairs[k] = &modelEntry{expires: expires}
		added = append(added, k.name+" "+k.addr.String())
	}
	slices.Sort(added)
	return added
}

func (m *model) gc(now time.Time, inUse func(netip.Addr) bool) []string {
	for _, e := range m.pairs {
		if !e.deferred && !e.expires.After(now) {
			e.deferred, e.lastUsed = true, e.expires
		}
	}
	var gone []modelKey
	for k, e := range m.pairs {
		if !e.deferred {
			continue
		}
		if inUse(k.addr) {
			e.lastUsed = now
		} else if !e.lastUsed.Add(m.cfg.IdleGrace).After(now) {
			gone = append(gone, k)
		}
	}
	var out []string
	for _, k := range gone {
		delete(m.pairs, k)
		out = append(out, k.name+" "+k.addr.String())
	}
	slices.Sort(out)
	return out
}

func entriesOf(removed []fqdn.Removed) []fqdn.Entry {
	var out []fqdn.Entry
	for _, r := range removed {
		out = append(out, r.Entry)
	}
	return out
}

// checkLast checks that of the pairs removed together, the last one
// removed of each address no name holds any more says Last, and no other.
func checkLast(t *testing.T, c *fqdn.Cache, removed []fqdn.Removed) {
	t.Helper()
	lasts := make(map[netip.Addr]int)
	for _, r := range removed {
		lasts[r.Addr] += 0
		if r.Last {
			lasts[r.Addr]++
		}
	}
	for addr, n := range lasts {
		want := 0
		if len(c.NamesOf(addr)) == 0 {
			want = 1
		}
		require.Equal(t, want, n, "removals of %s saying Last", addr)
	}
	for i := len(removed) - 1; i >= 0; i-- {
		if removed[i].Last {
			// No later removal is of the same address.
			for _, r := range removed[i+1:] {
				require.NotEqual(t, removed[i].Addr, r.Addr)
			}
		}
	}
}

func (m *model) entries() []fqdn.Entry {
	out := []fqdn.Entry{}
	for k, e := range m.pairs {
		out = append(out, fqdn.Entry{Name: k.name, Addr: k.addr, Expires: e.expires.UTC(), Deferred: e.deferred})
	}
	slices.SortFunc(out, func(a, b fqdn.Entry) int { return cmp.Or(cmp.Compare(a.Name, b.Name), a.Addr.Compare(b.Addr)) })
	return out
}

func (m *model) namesOf(addr netip.Addr) []string {
	out := []string{}
	for k := range m.pairs {
		if k.addr == addr {
			out = append(out, k.name)
		}
	}
	slices.Sort(out)
	return out
}

// TestCacheCapsRandom runs random operations with small caps and checks
// what must hold whatever gives way: the caps, the sizes, and that
// Added, Removed and Last say what changed.
func TestCacheCapsRandom(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 2))
		clk := newClock()
		// Small caps, and in half the runs caps that let a name hold more
		// pairs than it holds before indexing them.
		cfg := fqdn.Config{MaxAddressesPerName: 1 + rng.IntN(4), MaxLive: 1 + rng.IntN(8), MaxDeferred: 1 + rng.IntN(4), IdleGrace: time.Second}
		if seed%2 == 1 {
			cfg = fqdn.Config{MaxAddressesPerName: 10 + rng.IntN(30), MaxLive: 20 + rng.IntN(60), MaxDeferred: 5 + rng.IntN(40), IdleGrace: time.Second}
		}
		c := fqdn.NewCache(cfg, clk.now)
		held := make(map[modelKey]bool)
		check := func(removed []fqdn.Removed) {
			for _, r := range removed {
				k := modelKey{r.Name, r.Addr}
				require.True(t, held[k], "removed %v it did not hold", k)
				require.True(t, r.Deferred, "removed %v while live", k)
				delete(held, k)
			}
			checkLast(t, c, removed)
			s := c.Stats()
			require.LessOrEqual(t, s.Live, cfg.MaxLive)
			require.LessOrEqual(t, s.Deferred, cfg.MaxDeferred)
			entries := c.Entries()
			require.Len(t, entries, len(held))
			require.Equal(t, s.Live+s.Deferred, len(entries))
			perName := make(map[string]int)
			for _, e := range entries {
				require.True(t, held[modelKey{e.Name, e.Addr}])
				if !e.Deferred {
					perName[e.Name]++
					require.LessOrEqual(t, perName[e.Name], cfg.MaxAddressesPerName)
				}
			}
			require.Len(t, perName, countLiveNames(entries))
		}
		for range 1000 {
			switch rng.IntN(3) {
			case 0:
				a := fqdn.Answer{Question: fmt.Sprintf("n%d.example.com", rng.IntN(5))}
				for range 1 + rng.IntN(4+int(seed%2)*8) {
					a.Addresses = append(a.Addresses, fqdn.Address{Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(12 + int(seed%2)*40))}), TTL: uint32(rng.IntN(5))})
				}
				u := c.Add(a)
				for _, e := range u.Added {
					k := modelKey{e.Name, e.Addr}
					require.False(t, held[k], "added %v it held", k)
					held[k] = true
				}
				check(u.Removed)
			case 1:
				clk.advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
			case 2:
				check(c.GC(func(a netip.Addr) bool { return a.As4()[3]%3 == 0 }))
			}
		}
	}
}

func countLiveNames(entries []fqdn.Entry) int {
	names := make(map[string]bool)
	for _, e := range entries {
		if !e.Deferred {
			names[e.Name] = true
		}
	}
	return len(names)
}

// TestCacheHugeTTL: a TTL of 2^31-1 seconds and a huge MinTTL or grace do
// not overflow into the past.
func TestCacheHugeTTL(t *testing.T) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{MinTTL: time.Duration(1<<63 - 1), IdleGrace: time.Duration(1<<63 - 1)}, clk.now)
	c.Add(answerOf("a.example.com", 1<<31-1, "192.0.2.1"))
	clk.advance(100 * 365 * 24 * time.Hour)
	require.Empty(t, c.GC(nil))
	require.Equal(t, 1, c.Stats().Live)
	require.True(t, c.Entries()[0].Expires.After(clk.now()))
}
