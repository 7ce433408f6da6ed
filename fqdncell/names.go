// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/source"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Resource is the ipcache resource of the addresses learned from DNS.
const Resource = "fqdn"

type namesParams struct {
	cell.In

	Config    Config
	StateDir  statedir.Config
	Log       *slog.Logger
	DB        *statedb.DB
	IPCache   *ipcachecell.IPCache
	Metadata  statedb.Table[*ipcachecell.PrefixMetadata]
	Entries   statedb.Table[*ipcachecell.Entry]
	Policies  statedb.Table[*policy.Policy]
	DNSRules  statedb.Table[*policy.DNSRules]
	Endpoints statedb.Table[*endpoint.State] `optional:"true"`
	Datapath  dnsproxy.Datapath              `optional:"true"`
	Conntrack bpfmaps.ConntrackMaps          `optional:"true"`
	Publisher events.DNSPublisher            `optional:"true"`
	Metrics   *proxyMetrics
}

// Names is the names the DNS proxy learned and what they allow: it holds
// the cache of name-address pairs, the `fqdn` ipcache handle through which
// each address selected by a toFQDNs selector gets the identity of its
// selectors' labels, and the proxy. Its methods are safe for concurrent
// use.
type Names struct {
	cfg       Config
	log       *slog.Logger
	db        *statedb.DB
	ipcache   *ipcachecell.IPCache
	metadata  statedb.Table[*ipcachecell.PrefixMetadata]
	entries   statedb.Table[*ipcachecell.Entry]
	policies  statedb.Table[*policy.Policy]
	dnsRules  statedb.Table[*policy.DNSRules]
	endpoints statedb.Table[*endpoint.State]
	datapath  dnsproxy.Datapath
	conntrack bpfmaps.ConntrackMaps
	publisher events.DNSPublisher // nil without a monitor
	metrics   *proxyMetrics
	path      string // the checkpoint; "" without a state directory

	// mu guards what follows. Writes to the handle are made outside it,
	// in the order the changes were computed (writeMu).
	mu        sync.Mutex
	cache     *fqdn.Cache
	selectors map[string]fqdn.Matcher // by label
	// selectorsRev is the `policies` table's revision selectors are of.
	selectorsRev statedb.Revision
	// written is the labels the handle holds for each address;
	// peakWritten its largest size since it was last copied (a Go map
	// keeps the room of its largest size).
	written     map[netip.Addr]labels.Labels
	peakWritten int
	// clients is the endpoint that last resolved each name.
	clients map[string]string
	dirty   bool
	handle  *ipcachecell.Handle
	proxy   proxyServer

	writeMu sync.Mutex

	// startProxy and installRoutes start the proxy and route the steered
	// packets to it (tests replace them: they must not touch the host).
	startProxy    func(dnsproxy.Config) (proxyServer, error)
	installRoutes func() error
}

// proxyServer is the running proxy.
type proxyServer interface {
	Port() uint16
	Stats() dnsproxy.Stats
	Close() error
}

func newNames(p namesParams) *Names {
	n := &Names{
		cfg: p.Config, log: p.Log, db: p.DB, ipcache: p.IPCache, metadata: p.Metadata, entries: p.Entries,
		policies: p.Policies, dnsRules: p.DNSRules, endpoints: p.Endpoints, datapath: p.Datapath,
		conntrack: p.Conntrack, publisher: p.Publisher, metrics: p.Metrics,
		cache:     fqdn.NewCache(p.Config.cacheConfig(), nil),
		selectors: map[string]fqdn.Matcher{},
		written:   map[netip.Addr]labels.Labels{},
		clients:   map[string]string{},
		startProxy: func(cfg dnsproxy.Config) (proxyServer, error) {
			p, err := dnsproxy.Start(cfg)
			if err != nil {
				return nil, err // not a non-nil interface holding nil
			}
			return p, nil
		},
		installRoutes: installProxyRoutes,
	}
	if p.StateDir.StateDir != "" {
		n.path = filepath.Join(p.StateDir.StateDir, fqdn.CheckpointFileName)
	}
	return n
}

// change is what the handle must be told: the addresses' new labels (zero:
// remove the address).
type change struct {
	upserts []ipcachecell.PrefixUpsert
	removes []netip.Prefix
	// selected is set when an address of the answer learned has labels:
	// the handle holds it, now or before.
	selected bool
}

// learn adds an answer a client got to the cache and returns what the
// handle must be told.
func (n *Names) learn(client netip.Addr, answer fqdn.Answer) change {
	txn := n.db.ReadTxn()
	_, ep := n.subjectOf(txn, client)
	n.mu.Lock()
	defer n.mu.Unlock()
	// The selectors as the policies in force have them now: an answer
	// that comes right after a new toFQDNs policy (its DNS rule already
	// steers the query) is labelled for it. The learned addresses are
	// relabelled by the run loop.
	n.refreshSelectorsLocked(txn)
	update := n.cache.Add(answer)
	if ep != "" {
		n.clients[answer.Question] = ep
	}
	addrs := make([]netip.Addr, 0, len(answer.Addresses)+len(update.Removed))
	for _, a := range answer.Addresses {
		addrs = append(addrs, a.Addr)
	}
	for _, r := range update.Removed {
		addrs = append(addrs, r.Addr)
	}
	c := n.relabelLocked(txn, addrs)
	for _, a := range answer.Addresses {
		if _, ok := n.written[a.Addr.Unmap()]; ok {
			c.selected = true
			break
		}
	}
	n.dirty = n.dirty || len(update.Added) > 0 || len(update.Removed) > 0
	return c
}

func (c *change) empty() bool { return len(c.upserts) == 0 && len(c.removes) == 0 }

// relabelLocked computes the labels of each address from the names that
// hold it and the selectors in force, and returns what differs from what
// the handle holds, recording it as written.
func (n *Names) relabelLocked(txn statedb.ReadTxn, addrs []netip.Addr) change {
	var c change
	for _, addr := range addrs {
		want := n.labelsOf(txn, addr)
		have, held := n.written[addr]
		switch {
		case want.IsEmpty() && held:
			delete(n.written, addr)
			c.removes = append(c.removes, netip.PrefixFrom(addr, addr.BitLen()))
		case !want.IsEmpty() && (!held || have != want):
			n.written[addr] = want
			c.upserts = append(c.upserts, ipcachecell.PrefixUpsert{
				Prefix: netip.PrefixFrom(addr, addr.BitLen()), Metadata: ipcachecell.Metadata{Labels: want}})
		}
	}
	n.peakWritten = max(n.peakWritten, len(n.written))
	if n.peakWritten > 1024 && len(n.written) < n.peakWritten/4 {
		// Names learned in a burst and expired leave no room behind
		// (maps.Clone would copy the room too).
		written := make(map[netip.Addr]labels.Labels, len(n.written))
		for addr, l := range n.written {
			written[addr] = l
		}
		n.written = written
		n.peakWritten = len(n.written)
	}
	return c
}

// labelsOf returns the labels of an address: the label of each selector in
// force that matches one of the names holding it, and the cidr label of
// the longest prefix another owner has that covers it (0.0.0.0/0 or ::/0
// when none), so that CIDR selectors select the address as they would
// without its name. Empty when no selector matches.
func (n *Names) labelsOf(txn statedb.ReadTxn, addr netip.Addr) labels.Labels {
	var lbls []string
	for _, name := range n.cache.NamesOf(addr) {
		for label, m := range n.selectors {
			if m.Match(name) {
				lbls = append(lbls, label)
			}
		}
	}
	if len(lbls) == 0 {
		return labels.Labels{}
	}
	lbls = append(lbls, labels.CIDRLabel(n.covering(txn, addr)))
	l, err := labels.New(lbls...)
	if err != nil {
		// Selector labels are validated when policies are parsed.
		n.log.Error("BUG: invalid labels for a learned address", "address", addr, "labels", lbls, "error", err)
		return labels.Labels{}
	}
	return l
}

// covering returns the longest prefix covering addr that an owner other
// than this cell and restore holds metadata for: restore's prefixes are
// the previous run's entries, the learned addresses among them.
func (n *Names) covering(txn statedb.ReadTxn, addr netip.Addr) netip.Prefix {
	for bits := addr.BitLen(); bits > 0; bits-- {
		prefix := netip.PrefixFrom(addr, bits).Masked()
		for row := range n.metadata.Prefix(txn, ipcachecell.MetadataIndex.Query(prefix)) {
			if row.Prefix() == prefix && row.Resource() != Resource && row.Source() != source.Restored {
				return prefix
			}
		}
	}
	return netip.PrefixFrom(addr, 0).Masked()
}

// write tells the handle a change.
func (n *Names) write(c change) error {
	if c.empty() {
		return nil
	}
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	var errs []error
	if len(c.upserts) > 0 {
		errs = append(errs, n.handle.UpsertBatch(c.upserts))
	}
	if len(c.removes) > 0 {
		errs = append(errs, n.handle.RemoveBatch(c.removes))
	}
	return errors.Join(errs...)
}

// waitWritten waits until the ipcache map holds what the handle was told:
// the resolver has made the entries, and the datapath has written them
// (after the policy entries of their identities: make before break).
func (n *Names) waitWritten(ctx context.Context) error {
	if err := n.ipcache.WaitResolved(ctx); err != nil {
		return err
	}
	if n.datapath == nil {
		return nil
	}
	return n.datapath.WaitIPCacheWritten(ctx, n.entries.Revision(n.db.ReadTxn()))
}

// subjectOf returns the identity whose policy a client's traffic is under:
// its endpoint's, or 0 (the host-wide default) for an address of no local
// endpoint.
func (n *Names) subjectOf(txn statedb.ReadTxn, client netip.Addr) (identity.Number, string) {
	if n.endpoints == nil {
		return 0, ""
	}
	ep, _, found := n.endpoints.Get(txn, endpoint.AddressIndex.Query(client.Unmap()))
	if !found {
		return 0, ""
	}
	return ep.Identity, ep.ID()
}

// allow is the proxy's Allow: whether the client's DNS rules allow qname.
// A refused query is published as a monitor event.
func (n *Names) allow(client, server netip.AddrPort, q dns.Question) bool {
	if n.rulesAllow(client.Addr(), q.Name) {
		return true
	}
	if n.publisher != nil {
		subject, _ := n.subjectOf(n.db.ReadTxn(), client.Addr())
		rcode, _ := n.cfg.rejectRcode() // validated
		n.publisher.PublishDNS(events.DNS{
			Time: time.Now(), Client: client, Server: server, Endpoint: subject,
			Name: fqdn.CanonicalName(q.Name), Type: q.Qtype, Rcode: rcode, Verdict: events.DNSRefused,
		})
	}
	return false
}

// onAnswer is the proxy's OnAnswer: it learns the answer's addresses and
// returns once the ipcache map allows those a selector selects.
func (n *Names) onAnswer(ctx context.Context, client, server netip.AddrPort, msg *dns.Msg) {
	if len(msg.Question) != 1 {
		return
	}
	start := time.Now()
	answer := fqdn.ReadAnswer(msg, msg.Question[0].Name, fqdn.Limits{})
	var held time.Duration
	defer func() {
		if n.publisher == nil {
			return
		}
		ev := events.DNS{
			Time: start, Client: client, Server: server, Name: answer.Question, Type: msg.Question[0].Qtype,
			Rcode: msg.Rcode, Verdict: events.DNSForwarded, Held: held,
		}
		ev.Endpoint, _ = n.subjectOf(n.db.ReadTxn(), client.Addr())
		for _, a := range answer.Addresses[:min(len(answer.Addresses), events.MaxDNSAddresses)] {
			ev.Addresses = append(ev.Addresses, a.Addr)
		}
		n.publisher.PublishDNS(ev)
	}()
	if msg.Rcode != dns.RcodeSuccess {
		return
	}
	n.metrics.skipped.Add(float64(answer.Skipped.Total()))
	if len(answer.Addresses) == 0 {
		return
	}
	c := n.learn(client.Addr(), answer)
	selected := c.selected
	if err := n.write(c); err != nil {
		n.log.Error("Cannot write the addresses of a DNS answer into the ipcache", "name", answer.Question, "error", err)
		return
	}
	if !selected {
		// No selector selects the name: nothing to wait for.
		return
	}
	// Even without a change: the entry another answer wrote may not be in
	// the map yet, and this client may connect at once.
	err := n.waitWritten(ctx)
	held = time.Since(start)
	n.metrics.hold.Observe(held.Seconds())
	if err != nil {
		n.metrics.holdTimeouts.Inc()
		n.log.Warn("A DNS answer was released before its addresses were allowed in the kernel",
			"name", answer.Question, "client", client, "held", held, "max", n.cfg.ToFQDNsProxyResponseMaxDelay, "error", err)
	}
}

// refreshSelectorsLocked makes the selectors those of the policies in
// force in txn, if the `policies` table changed since they were read.
func (n *Names) refreshSelectorsLocked(txn statedb.ReadTxn) {
	rev := n.policies.Revision(txn)
	if rev == n.selectorsRev && n.selectorsRev != 0 {
		return
	}
	n.selectors, n.selectorsRev = selectorsIn(txn, n.policies, n.log), rev
}

// selectorsIn returns the toFQDNs selectors of the policies in force, by
// label.
func selectorsIn(txn statedb.ReadTxn, policies statedb.Table[*policy.Policy], log *slog.Logger) map[string]fqdn.Matcher {
	out := map[string]fqdn.Matcher{}
	for p := range policies.All(txn) {
		for _, rule := range p.Egress {
			if rule.FQDN == nil {
				continue
			}
			for _, sel := range rule.FQDN.Selectors {
				label := sel.Label()
				if _, ok := out[label]; ok {
					continue
				}
				m, err := sel.Compile()
				if err != nil {
					// Policies are validated when parsed.
					log.Error("BUG: invalid toFQDNs selector in force", "policy", p.Name, "selector", sel, "error", err)
					continue
				}
				out[label] = m
			}
		}
	}
	return out
}

// allAddrsLocked returns every address the cache holds or the handle was
// told of.
func (n *Names) allAddrsLocked() []netip.Addr {
	seen := map[netip.Addr]struct{}{}
	for _, e := range n.cache.Entries() {
		seen[e.Addr] = struct{}{}
	}
	for a := range n.written {
		seen[a] = struct{}{}
	}
	return slices.SortedFunc(maps.Keys(seen), netip.Addr.Compare)
}

// Entry is one learned name-address pair as fqdn/cache-list shows it.
type Entry struct {
	Name     string          `json:"name"`
	Address  netip.Addr      `json:"address"`
	Expires  time.Time       `json:"expires"`
	Deferred bool            `json:"deferred"`
	Identity identity.Number `json:"identity"`
	Endpoint string          `json:"endpoint"`
}

// Entries returns the learned pairs, by name then address, each with the
// identity its address maps to in the ipcache (0 when no selector selects
// it) and the endpoint that last resolved the name.
func (n *Names) Entries() []Entry {
	txn := n.db.ReadTxn()
	n.mu.Lock()
	pairs := n.cache.Entries()
	clients := make(map[string]string, len(pairs))
	for _, e := range pairs {
		clients[e.Name] = n.clients[e.Name]
	}
	n.mu.Unlock()
	out := make([]Entry, 0, len(pairs))
	for _, e := range pairs {
		row := Entry{Name: e.Name, Address: e.Addr, Expires: e.Expires, Deferred: e.Deferred, Endpoint: clients[e.Name]}
		if entry, _, ok := n.entries.Get(txn, ipcachecell.EntryIndex.Query(netip.PrefixFrom(e.Addr, e.Addr.BitLen()))); ok {
			row.Identity = entry.Identity
		}
		out = append(out, row)
	}
	return out
}

// Stats returns the cache's sizes.
func (n *Names) Stats() fqdn.Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cache.Stats()
}

// ProxyStats returns the proxy's counters, zero while it does not run.
func (n *Names) ProxyStats() dnsproxy.Stats {
	n.mu.Lock()
	p := n.proxy
	n.mu.Unlock()
	if p == nil {
		return dnsproxy.Stats{}
	}
	return p.Stats()
}

// enforcer tells the policy cell that toFQDNs and DNS rules are enforced
// in this hive.
func enforcer() *policy.FQDNEnforcer { return &policy.FQDNEnforcer{Name: "DNS proxy (fqdn)"} }
