// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"golang.org/x/time/rate"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// registerNames opens the handle at start, and registers the cell as an
// ipcache producer (the learned names of the previous run are in the
// ipcache before it is initialized) and its jobs.
func registerNames(n *Names, lc cell.Lifecycle, jobs job.Group) {
	restored := n.ipcache.RegisterProducer(Resource)
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			h, err := n.ipcache.NewHandle(Resource, source.Generated, ipcachecell.SharedIdentity())
			if err != nil {
				return fmt.Errorf("open the %s ipcache handle: %w", Resource, err)
			}
			n.handle = h
			return nil
		},
		OnStop: func(cell.HookContext) error {
			n.mu.Lock()
			p := n.proxy
			n.proxy = nil
			n.mu.Unlock()
			if p != nil {
				p.Close()
			}
			return n.checkpoint()
		},
	})
	jobs.Add(job.OneShot("fqdn-names", func(ctx context.Context, health cell.Health) error {
		return n.run(ctx, health, restored)
	}))
	jobs.Add(job.Timer("fqdn-gc", n.gc, n.cfg.ToFQDNsGCInterval))
	jobs.Add(job.OneShot("fqdn-proxy", n.runProxy))
}

// run restores the previous run's names, then keeps the learned addresses'
// labels in line with the toFQDNs selectors in force.
func (n *Names) run(ctx context.Context, health cell.Health, restored func()) error {
	done := false
	defer func() {
		if !done {
			restored()
		}
	}()
	previous := n.readCheckpoint()

	// The selectors are needed to label the restored addresses: wait for
	// the policies of the policy directory.
	if !n.waitInitialized(ctx, health, n.policies) {
		return nil
	}
	txn := n.db.ReadTxn()
	n.mu.Lock()
	n.refreshSelectorsLocked(txn)
	update := n.cache.Restore(previous)
	c := n.relabelLocked(txn, n.allAddrsLocked())
	n.mu.Unlock()
	if err := n.write(c); err != nil {
		return fmt.Errorf("write the restored names into the ipcache: %w", err)
	}
	if len(previous) > 0 {
		n.log.Info("Restored names learned from DNS", "pairs", len(update.Added), "addresses", len(c.upserts))
	}
	restored()
	done = true

	// The answers recorded while no proxy ran: checked against the DNS
	// rules, which the policy cell computes once the ipcache is
	// initialized. Their addresses were not allowed while the agent was
	// down (the maps did not have them); they are as soon as it is back.
	if !n.waitInitialized(ctx, health, n.dnsRules) {
		return nil
	}
	if recorded := n.recordedReader(); recorded != nil {
		defer recorded.Close()
		if learned := n.drainRecorded(recorded); learned > 0 {
			n.log.Info("Learned the DNS answers recorded while no proxy ran", "answers", learned)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.followRecorded(ctx, recorded)
		}()
		defer wg.Wait()
	}

	// Every change of the policies in force relabels the learned
	// addresses: a new selector selects the names learned before it, and
	// a new CIDR or except prefix covering an address must give it its
	// cidr label (an except learned under its CIDR's label would let its
	// addresses through). The policy directory resolves a policy's
	// prefixes before the policy is in force, so the covering prefixes
	// are in the metadata table by then. At most once per relabelInterval:
	// each relabel reads every learned address.
	limiter := rate.NewLimiter(rate.Every(relabelInterval), 1)
	for {
		if err := limiter.Wait(ctx); err != nil {
			return nil
		}
		txn := n.db.ReadTxn()
		_, watch := n.policies.AllWatch(txn)
		n.mu.Lock()
		n.refreshSelectorsLocked(txn)
		c := n.relabelLocked(txn, n.allAddrsLocked())
		stats := n.cache.Stats()
		n.mu.Unlock()
		if err := n.write(c); err != nil {
			health.Degraded("Cannot relabel the learned addresses", err)
		} else {
			health.OK(fmt.Sprintf("%d names, %d addresses learned", stats.Names, stats.Addresses))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		}
	}
}

// relabelInterval bounds how often a change of the policies relabels the
// learned addresses.
const relabelInterval = 200 * time.Millisecond

// waitInitialized waits until table is initialized, and reports false if
// ctx ended first.
func (n *Names) waitInitialized(ctx context.Context, health cell.Health, table statedb.TableMeta) bool {
	for {
		ok, watch := table.Initialized(n.db.ReadTxn())
		if ok {
			return true
		}
		health.OK("Waiting for the table " + table.Name())
		select {
		case <-ctx.Done():
			return false
		case <-watch:
		}
	}
}

// recordedReader returns a reader of the program's recorded answers, nil
// without a datapath or its maps.
func (n *Names) recordedReader() *ringbuf.Reader {
	if n.datapath == nil {
		return nil
	}
	ring, err := n.datapath.DNSAnswers()
	if err != nil {
		n.log.Info("No ring of recorded DNS answers: answers that bypass the proxy are not learned", "reason", err)
		return nil
	}
	r, err := ringbuf.NewReader(ring)
	if err != nil {
		n.log.Error("Cannot read the ring of recorded DNS answers", "error", err)
		return nil
	}
	return r
}

// gc removes the expired pairs no tracked connection uses, and writes the
// checkpoint when the cache changed.
func (n *Names) gc(ctx context.Context) error {
	inUse := n.inUse()
	txn := n.db.ReadTxn()
	n.mu.Lock()
	removed := n.cache.GC(inUse)
	addrs := make([]netip.Addr, 0, len(removed))
	for _, r := range removed {
		addrs = append(addrs, r.Addr)
		if !n.cache.Holds(r.Name) {
			delete(n.clients, r.Name)
		}
	}
	c := n.relabelLocked(txn, addrs)
	n.dirty = n.dirty || len(removed) > 0
	n.mu.Unlock()
	n.metrics.expired.Add(float64(len(removed)))
	if err := n.write(c); err != nil {
		return fmt.Errorf("remove expired addresses from the ipcache: %w", err)
	}
	return n.checkpoint()
}

// inUse returns whether a tracked connection uses an address: the
// conntrack maps are read once, when the cache first asks.
func (n *Names) inUse() func(netip.Addr) bool {
	var remotes map[netip.Addr]struct{}
	return func(addr netip.Addr) bool {
		if remotes == nil {
			remotes = n.trackedRemotes()
		}
		_, ok := remotes[addr.Unmap()]
		return ok
	}
}

// trackedRemotes returns the remote addresses of the conntrack maps'
// entries.
func (n *Names) trackedRemotes() map[netip.Addr]struct{} {
	out := map[netip.Addr]struct{}{}
	if n.conntrack == nil {
		return out
	}
	for _, m := range []*ebpf.Map{n.conntrack.Conntrack(), n.conntrack.ConntrackOpening()} {
		if m == nil {
			continue
		}
		var (
			key   bpfmaps.ConntrackKey
			value bpfmaps.ConntrackValue
		)
		it := m.Iterate()
		for it.Next(&key, &value) {
			if _, remote, _, err := key.Fields(); err == nil {
				out[remote.Addr().Unmap()] = struct{}{}
			}
		}
		if err := it.Err(); err != nil {
			n.log.Warn("Cannot read the conntrack map for the learned addresses in use", "error", err)
		}
	}
	return out
}

// checkpoint writes the learned pairs into the state directory if they
// changed since the last write.
func (n *Names) checkpoint() error {
	if n.path == "" {
		return nil
	}
	n.mu.Lock()
	if !n.dirty {
		n.mu.Unlock()
		return nil
	}
	entries := n.cache.Entries()
	n.dirty = false
	n.mu.Unlock()
	err := atomicfile.Write(n.path, func(w io.Writer) error { return fqdn.WriteCheckpoint(w, entries) })
	if err != nil {
		n.mu.Lock()
		n.dirty = true
		n.mu.Unlock()
		return fmt.Errorf("write the names checkpoint (--state-dir): %w", err)
	}
	return nil
}

// readCheckpoint returns the previous run's pairs; a corrupt checkpoint
// is set aside and restores nothing.
func (n *Names) readCheckpoint() []fqdn.Entry {
	if n.path == "" {
		return nil
	}
	max := n.cfg.cacheConfig().MaxLive + n.cfg.cacheConfig().MaxDeferred
	f, err := os.Open(n.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		n.log.Error("Cannot read the names checkpoint; restoring no names", "path", n.path, "error", err)
		return nil
	}
	defer f.Close()
	entries, err := fqdn.ReadCheckpoint(f, max)
	if err != nil {
		aside, moveErr := statedir.SetAside(n.path)
		n.log.Error("The names checkpoint is corrupt; moved aside, restoring no names",
			"path", n.path, "moved-to", aside, "error", err)
		if moveErr != nil {
			n.log.Error("Cannot move the corrupt names checkpoint aside", "path", n.path, "error", moveErr)
		}
		return nil
	}
	return entries
}

// runProxy starts the proxy once a policy in force has DNS rules, and
// tells the datapath its port.
func (n *Names) runProxy(ctx context.Context, health cell.Health) error {
	for {
		txn := n.db.ReadTxn()
		iter, watch := n.dnsRules.AllWatch(txn)
		wanted := false
		for range iter {
			wanted = true
			break
		}
		if wanted {
			break
		}
		health.OK("No DNS rules in force: the proxy is not started")
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		}
	}
	if n.datapath == nil {
		return ErrNoDatapath
	}
	rcode, _ := n.cfg.rejectRcode() // validated
	p, err := n.startProxy(dnsproxy.Config{
		Port:        n.cfg.ToFQDNsProxyPort,
		Allow:       n.allow,
		OnAnswer:    n.onAnswer,
		MaxHold:     n.cfg.ToFQDNsProxyResponseMaxDelay,
		RejectRcode: rcode,
		Observe:     n.metrics.observe,
	})
	if err != nil {
		return fmt.Errorf("start the DNS proxy (--tofqdns-proxy-port %d): %w", n.cfg.ToFQDNsProxyPort, err)
	}
	if err := n.installRoutes(); err != nil {
		p.Close()
		return fmt.Errorf("route the steered DNS to the proxy: %w", err)
	}
	if err := n.datapath.SetDNSProxyPort(p.Port()); err != nil {
		p.Close()
		return fmt.Errorf("tell the program the DNS proxy's port: %w", err)
	}
	n.mu.Lock()
	n.proxy = p
	n.mu.Unlock()
	n.log.Info("DNS proxy started", "port", p.Port())
	health.OK(fmt.Sprintf("DNS proxy on port %d", p.Port()))
	// The port stays in the pinned map when the agent stops: with no
	// socket on it the program lets DNS go to its servers, and records
	// their answers for the next agent to learn.
	<-ctx.Done()
	return nil
}
