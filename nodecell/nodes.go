// SPDX-License-Identifier: Apache-2.0

package nodecell

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// The ipcache resources of the node addresses.
const (
	HostResource       = "node/host"
	RemoteNodeResource = "node/remote-node"
)

// Address is one address of the host or remote-node entity.
type Address struct {
	Addr netip.Addr
	// Entity is identity.EntityHost or identity.EntityRemoteNode.
	Entity identity.Entity
	// Nodes are the names of the Node documents that list the address,
	// sorted; this node's name for an address of this node's own
	// document; none for an address only a link of this node has.
	Nodes []string
}

// Nodes keeps the addresses of this node and of the other nodes in the
// ipcache. Its methods are safe for concurrent use: the host addresses'
// job and the endpoint directory call it.
type Nodes struct {
	log *slog.Logger
	// host and remote are the handles of HostResource and
	// RemoteNodeResource.
	host, remote *ipcachecell.Handle
	hostLabels   labels.Labels
	remoteLabels labels.Labels

	mu sync.Mutex
	// links are the addresses of this node's links, as last listed.
	links map[netip.Addr]struct{}
	// thisNode is this node's name, and nodes the addresses of every Node
	// document by name, as last set.
	thisNode string
	nodes    map[string][]netip.Addr
	// applied are the addresses as the handles hold them.
	applied map[netip.Addr]Address
}

// newNodes returns the Nodes with their two handles.
//
// Possible errors: those of ipcachecell.IPCache.NewHandle (a resource
// already in use).
func newNodes(log *slog.Logger, ipcache *ipcachecell.IPCache) (*Nodes, error) {
	host, err := ipcache.NewHandle(HostResource, source.Local)
	if err != nil {
		return nil, err
	}
	// Node documents come from the endpoint directory: the source is
	// the directory's, as its endpoints'.
	remote, err := ipcache.NewHandle(RemoteNodeResource, source.Directory)
	if err != nil {
		return nil, err
	}
	hostLabels, err := labels.New(identity.EntityHost.ReservedLabel())
	if err != nil {
		return nil, err
	}
	remoteLabels, err := labels.New(identity.EntityRemoteNode.ReservedLabel())
	if err != nil {
		return nil, err
	}
	return &Nodes{log: log, host: host, remote: remote, hostLabels: hostLabels, remoteLabels: remoteLabels,
		links: map[netip.Addr]struct{}{}, nodes: map[string][]netip.Addr{}, applied: map[netip.Addr]Address{}}, nil
}

// SetNodes replaces the Node documents: the addresses of the node named
// thisNode are host addresses, with this node's links' own; those of the
// others are remote-node addresses, unless one is a host address too.
// The ipcache has the metadata when it returns (resolved later), so a
// caller that holds the ipcache's initialization calls it before it says
// it is done.
//
// Possible errors: those of ipcachecell.Handle.UpsertBatch and
// RemoveBatch (a bug); a later call writes what this one could not.
func (n *Nodes) SetNodes(thisNode string, nodes []endpoint.Node) error {
	byName := make(map[string][]netip.Addr, len(nodes))
	for _, node := range nodes {
		byName[node.Name] = append(byName[node.Name], node.Addresses...)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.thisNode, n.nodes = thisNode, byName
	return n.apply()
}

// setLinkAddresses replaces the addresses of this node's links.
//
// Possible errors: as SetNodes.
func (n *Nodes) setLinkAddresses(addrs map[netip.Addr]struct{}) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.links = addrs
	return n.apply()
}

// Addresses returns the addresses the handles hold, in address order.
func (n *Nodes) Addresses() []Address {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Address, 0, len(n.applied))
	for _, addr := range slices.SortedFunc(maps.Keys(n.applied), netip.Addr.Compare) {
		out = append(out, n.applied[addr])
	}
	return out
}

// desired is the address set that the links and the Node documents make.
func (n *Nodes) desired() map[netip.Addr]Address {
	want := make(map[netip.Addr]Address, len(n.links))
	for addr := range n.links {
		want[addr] = Address{Addr: addr, Entity: identity.EntityHost}
	}
	for _, addr := range n.nodes[n.thisNode] {
		want[addr] = Address{Addr: addr, Entity: identity.EntityHost, Nodes: []string{n.thisNode}}
	}
	for _, name := range slices.Sorted(maps.Keys(n.nodes)) {
		if name == n.thisNode {
			continue
		}
		for _, addr := range n.nodes[name] {
			a, have := want[addr]
			switch {
			case have && a.Entity == identity.EntityHost:
				// This node's address in another node's document (a
				// stale document, a shared address): it is this
				// node's, and one entity's.
				continue
			case have && slices.Contains(a.Nodes, name):
				continue
			}
			want[addr] = Address{Addr: addr, Entity: identity.EntityRemoteNode, Nodes: append(a.Nodes, name)}
		}
	}
	return want
}

// apply brings the handles to the desired addresses: the upserts first,
// so that an address that moves from one entity to the other always has
// an entry. Called with mu held.
func (n *Nodes) apply() error {
	want := n.desired()
	var (
		upserts          = map[identity.Entity][]ipcachecell.PrefixUpsert{}
		removes          = map[identity.Entity][]netip.Prefix{}
		added, removed   = map[identity.Entity]int{}, map[identity.Entity]int{}
		total            = map[identity.Entity]int{}
		hostMD, remoteMD = ipcachecell.Metadata{Labels: n.hostLabels}, ipcachecell.Metadata{Labels: n.remoteLabels}
	)
	for addr, w := range want {
		total[w.Entity]++
		old, had := n.applied[addr]
		if had && old.Entity == w.Entity {
			continue
		}
		md := hostMD
		if w.Entity == identity.EntityRemoteNode {
			md = remoteMD
		}
		prefix := netip.PrefixFrom(addr, addr.BitLen())
		upserts[w.Entity] = append(upserts[w.Entity], ipcachecell.PrefixUpsert{Prefix: prefix, Metadata: md})
		added[w.Entity]++
		if had {
			removes[old.Entity] = append(removes[old.Entity], prefix)
			removed[old.Entity]++
		}
	}
	for addr, old := range n.applied {
		if _, ok := want[addr]; !ok {
			removes[old.Entity] = append(removes[old.Entity], netip.PrefixFrom(addr, addr.BitLen()))
			removed[old.Entity]++
		}
	}
	handles := map[identity.Entity]*ipcachecell.Handle{identity.EntityHost: n.host, identity.EntityRemoteNode: n.remote}
	for _, entity := range []identity.Entity{identity.EntityHost, identity.EntityRemoteNode} {
		if err := handles[entity].UpsertBatch(upserts[entity]); err != nil {
			return fmt.Errorf("%s addresses: %w", entity, err)
		}
	}
	for _, entity := range []identity.Entity{identity.EntityHost, identity.EntityRemoteNode} {
		if err := handles[entity].RemoveBatch(removes[entity]); err != nil {
			return fmt.Errorf("%s addresses: %w", entity, err)
		}
	}
	n.applied = want
	if added[identity.EntityHost]+removed[identity.EntityHost] > 0 {
		n.log.Info("Host addresses changed", "added", added[identity.EntityHost],
			"removed", removed[identity.EntityHost], "total", total[identity.EntityHost])
	}
	if added[identity.EntityRemoteNode]+removed[identity.EntityRemoteNode] > 0 {
		n.log.Info("Remote node addresses changed", "added", added[identity.EntityRemoteNode],
			"removed", removed[identity.EntityRemoteNode], "total", total[identity.EntityRemoteNode])
	}
	return nil
}
