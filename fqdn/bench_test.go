// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func nthAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

func nthName(i int) string { return fmt.Sprintf("n%d.example.com", i) }

// BenchmarkCacheAdd learns b.N answers of one fresh address each: for
// a fresh name each (per-name), or for one of 64 names (per-address,
// each name at its cap of 1000 live addresses once full, the oldest
// deferred, and past 10000 deferred removed). kept-B/pair is the heap the
// cache keeps per pair it holds at the end, names included.
//
//	go test -run '^$' -bench BenchmarkCacheAdd -benchmem ./fqdn/
func BenchmarkCacheAdd(b *testing.B) {
	for _, bench := range []struct {
		name  string
		names int // 0: a fresh name per answer
	}{{"per-name", 0}, {"per-address", 64}} {
		b.Run(bench.name, func(b *testing.B) {
			clk := newClock()
			cfg := fqdn.Config{}
			if bench.names == 0 {
				cfg.MaxLive = b.N + 1 // nothing gives way
			}
			c := fqdn.NewCache(cfg, clk.now)
			before := heapInUse()
			b.ResetTimer()
			for i := range b.N {
				name := nthName(i)
				if bench.names > 0 {
					name = nthName(i % bench.names)
				}
				c.Add(fqdn.Answer{Question: name, Addresses: []fqdn.Address{{Addr: nthAddr(i), TTL: uint32(60 + i%60)}}})
			}
			b.StopTimer()
			after := heapInUse()
			s := c.Stats()
			b.ReportMetric(float64(int64(after)-int64(before))/float64(s.Live+s.Deferred), "kept-B/pair")
			runtime.KeepAlive(c)
		})
	}
}

// BenchmarkCacheGC expires b.N pairs of b.N names in one GC.
func BenchmarkCacheGC(b *testing.B) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{MaxLive: b.N + 1}, clk.now)
	for i := range b.N {
		c.Add(fqdn.Answer{Question: nthName(i), Addresses: []fqdn.Address{{Addr: nthAddr(i), TTL: uint32(i % 60)}}})
	}
	clk.advance(time.Minute)
	b.ResetTimer()
	removed := c.GC(nil)
	b.StopTimer()
	if len(removed) != b.N {
		b.Fatalf("removed %d of %d", len(removed), b.N)
	}
}

// BenchmarkCacheAddRotating is a name that answers 8 of many addresses
// each time (as S3 does): at its cap of 1000 live addresses, with the
// deferred ones (up to 10000) of the same name.
func BenchmarkCacheAddRotating(b *testing.B) {
	clk := newClock()
	c := fqdn.NewCache(fqdn.Config{}, clk.now)
	for i := range b.N {
		a := fqdn.Answer{Question: "bucket.s3.example.com"}
		for j := range 8 {
			a.Addresses = append(a.Addresses, fqdn.Address{Addr: nthAddr((i*8 + j) % 50000), TTL: 5})
		}
		c.Add(a)
		if i%100 == 0 {
			clk.advance(time.Second)
			c.GC(nil)
		}
	}
}
