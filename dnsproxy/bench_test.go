// SPDX-License-Identifier: Apache-2.0

package dnsproxy_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// benchNetnsEnv tells a benchmark binary that it runs in the namespace
// its parent made for it.
const benchNetnsEnv = "IPCACHE_AGENT_BENCH_DNSPROXY_NETNS"

// inFreshNetnsBench runs the calling benchmark in a test binary of its own
// under `ip netns exec` in a namespace made for it (a benchmark's
// goroutines run on any thread, so its whole process must be there), and
// prints that run's output. It returns true in that child; in the parent
// it skips the benchmark once the child is done.
func inFreshNetnsBench(b *testing.B) bool {
	if os.Getenv(benchNetnsEnv) != "" {
		return true
	}
	privileged.Test(b)
	ns := fmt.Sprintf("dnsp-bench-%d", os.Getpid())
	run(b, "ip", "netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	run(b, "ip", "-n", ns, "link", "set", "lo", "up")
	args := []string{"netns", "exec", ns, os.Args[0], "-test.run=^$",
		"-test.bench=^" + regexp.QuoteMeta(b.Name()) + "$"}
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.benchtime") || strings.HasPrefix(a, "-test.count") || strings.HasPrefix(a, "-test.benchmem") {
			args = append(args, a)
		}
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), benchNetnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	os.Stdout.Write(out)
	if err != nil {
		b.Fatalf("benchmark in netns %s: %v", ns, err)
	}
	b.Skip("ran in its own network namespace: results above")
	return false
}

// BenchmarkExchange is one UDP query and its answer from the client
// namespace to the server, directly (steering off) and through the
// proxy, with the latencies' median and 99th percentile.
func BenchmarkExchange(b *testing.B) {
	if !inFreshNetnsBench(b) {
		return
	}
	top, port := newTopology(b)
	p, err := dnsproxy.Start(dnsproxy.Config{
		Allow:    func(netip.AddrPort, netip.AddrPort, dns.Question) bool { return true },
		OnAnswer: func(context.Context, netip.AddrPort, netip.AddrPort, *dns.Msg) {},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var c *net.UDPConn
	if err := netnstest.InNetns(b, top.client, func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(serverAP))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	q, err := new(dns.Msg).SetQuestion("bench.allowed.example.", dns.TypeA).Pack()
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct {
		name string
		port uint16
	}{{"direct", 0}, {"proxied", p.Port()}} {
		b.Run(mode.name, func(b *testing.B) {
			if err := port.Set(mode.port); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 4096)
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				c.SetDeadline(start.Add(2 * time.Second))
				if _, err := c.Write(q); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
	if st := p.Stats(); st.Forwarded == 0 {
		b.Errorf("proxy forwarded nothing: %+v", st)
	}
}

// BenchmarkExchangeRate is BenchmarkExchange at a steady rate, 100 and
// 1,000 queries a second for three seconds, each query from its own
// goroutine on a socket of a pool, directly and through the proxy: what
// forwarding adds under load (the fqdn cell's hold, which comes on top
// for an answer with addresses to allow, is its BenchmarkHold).
func BenchmarkExchangeRate(b *testing.B) {
	if !inFreshNetnsBench(b) {
		return
	}
	top, port := newTopology(b)
	p, err := dnsproxy.Start(dnsproxy.Config{
		Allow:    func(netip.AddrPort, netip.AddrPort, dns.Question) bool { return true },
		OnAnswer: func(context.Context, netip.AddrPort, netip.AddrPort, *dns.Msg) {},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	const poolSize = 64
	pool := make(chan *net.UDPConn, poolSize)
	for range poolSize {
		var c *net.UDPConn
		if err := netnstest.InNetns(b, top.client, func() (err error) {
			c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(serverAP))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		pool <- c
	}
	q, err := new(dns.Msg).SetQuestion("bench.allowed.example.", dns.TypeA).Pack()
	if err != nil {
		b.Fatal(err)
	}
	for _, rate := range []int{100, 1000} {
		for _, mode := range []struct {
			name string
			port uint16
		}{{"direct", 0}, {"proxied", p.Port()}} {
			b.Run(fmt.Sprintf("rate=%d/%s", rate, mode.name), func(b *testing.B) {
				if err := port.Set(mode.port); err != nil {
					b.Fatal(err)
				}
				queries := 3 * rate
				lat := make([]time.Duration, queries)
				var failed atomic.Int64
				var wg sync.WaitGroup
				tick := time.NewTicker(time.Second / time.Duration(rate))
				defer tick.Stop()
				for i := range queries {
					<-tick.C
					wg.Add(1)
					go func() {
						defer wg.Done()
						c := <-pool
						defer func() { pool <- c }()
						buf := make([]byte, 4096)
						start := time.Now()
						c.SetDeadline(start.Add(2 * time.Second))
						if _, err := c.Write(q); err != nil {
							failed.Add(1)
							return
						}
						if _, err := c.Read(buf); err != nil {
							failed.Add(1)
							return
						}
						lat[i] = time.Since(start)
					}()
				}
				wg.Wait()
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d of %d queries unanswered", n, queries)
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
