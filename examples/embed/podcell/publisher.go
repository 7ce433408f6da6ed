// SPDX-License-Identifier: Apache-2.0

package podcell

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
)

// publisher keeps the "pods" handle in line with the pods file.
type publisher struct {
	path         string
	ipcache      *ipcachecell.IPCache
	log          *slog.Logger
	producerDone func()

	mu      sync.Mutex
	handle  *ipcachecell.Handle
	inForce map[netip.Addr]identity.Number
}

var _ cell.HookInterface = (*publisher)(nil)

// Start implements cell.HookInterface: the first read. An invalid file
// fails the start, rather than leaving the ipcache uninitialized.
func (p *publisher) Start(cell.HookContext) error {
	handle, err := p.ipcache.NewHandle(Resource, Source)
	if err != nil {
		return fmt.Errorf("start pods publisher: %w", err)
	}
	p.mu.Lock()
	p.handle = handle
	p.mu.Unlock()
	if err := p.sync(); err != nil {
		return err
	}
	p.producerDone()
	return nil
}

// Stop implements cell.HookInterface. The handle is not released: the
// datapath outlives the agent, and the next run publishes the pods again.
func (p *publisher) Stop(cell.HookContext) error { return nil }

// sync reads the file and publishes the difference to what is in force:
// new and changed pods are upserted, pods gone from the file are removed.
// On error nothing changes.
func (p *publisher) sync() error {
	pods, err := ParseFile(p.path)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	var (
		upserts []ipcachecell.PrefixUpsert
		removes []netip.Prefix
	)
	for addr, id := range pods {
		if old, ok := p.inForce[addr]; !ok || old != id {
			upserts = append(upserts, ipcachecell.PrefixUpsert{
				Prefix:   hostPrefix(addr),
				Metadata: ipcachecell.Metadata{ExplicitIdentity: id},
			})
		}
	}
	for addr := range p.inForce {
		if _, ok := pods[addr]; !ok {
			removes = append(removes, hostPrefix(addr))
		}
	}
	if len(upserts) == 0 && len(removes) == 0 {
		return nil
	}
	// In address order, so that logs and writes are deterministic.
	slices.SortFunc(upserts, func(a, b ipcachecell.PrefixUpsert) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	slices.SortFunc(removes, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if err := p.handle.UpsertBatch(upserts); err != nil {
		return fmt.Errorf("publish pods of %s: %w", p.path, err)
	}
	if err := p.handle.RemoveBatch(removes); err != nil {
		// The next round upserts again (no change) and retries these.
		return fmt.Errorf("remove pods gone from %s: %w", p.path, err)
	}
	p.inForce = pods
	p.log.Info("Published pods", "file", p.path, "pods", len(pods),
		"upserted", len(upserts), "removed", len(removes))
	return nil
}

// hostPrefix is the /32 or /128 of a pod's address.
func hostPrefix(addr netip.Addr) netip.Prefix {
	return netip.PrefixFrom(addr, addr.BitLen())
}
