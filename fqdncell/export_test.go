// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"context"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
)

// What the script tests (package fqdncell_test, which builds its hive
// with package cells, which imports this one) reach inside.

// ProxyServer is the running proxy, for a fake.
type ProxyServer = proxyServer

// StubHost replaces the proxy's start and the routes with fakes: the
// tests must not touch the host.
func (n *Names) StubHost(start func(dnsproxy.Config) (ProxyServer, error)) {
	n.installRoutes = func() error { return nil }
	n.startProxy = start
}

func (n *Names) Allow(client, server netip.AddrPort, qname string) bool {
	return n.allow(client, server, dns.Question{Name: qname, Qtype: dns.TypeA, Qclass: dns.ClassINET})
}

func (n *Names) OnAnswer(ctx context.Context, client, server netip.AddrPort, msg *dns.Msg) {
	n.onAnswer(ctx, client, server, msg)
}

func (n *Names) GC(ctx context.Context) error { return n.gc(ctx) }

func (n *Names) MaxDelay() time.Duration { return n.cfg.ToFQDNsProxyResponseMaxDelay }

func (n *Names) LearnRecorded(raw []byte) bool { return n.learnRecorded(raw) }
