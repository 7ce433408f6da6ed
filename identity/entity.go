// SPDX-License-Identifier: Apache-2.0

package identity

// The reserved identities of the entities, Cilium's numbers. World is
// above. Addresses of this node and of other nodes are not mapped to Host
// and RemoteNode themselves: each gets a local identity whose labels hold
// its cidr label and the entity's reserved label (ReservedLabel), so that
// CIDR rules keep selecting them one by one (Cilium's
// policy-cidr-match-mode "nodes") while the entity selects them all. The
// reserved numbers are still selected, for addresses some other producer
// maps to them.
const (
	Host          Number = 1
	Unmanaged     Number = 3
	Health        Number = 4
	Init          Number = 5
	RemoteNode    Number = 6
	KubeAPIServer Number = 7
	Ingress       Number = 8
)

// Entity is an entity a policy names in toEntities or fromEntities.
type Entity string

// The entities a policy may name, as in Cilium.
const (
	EntityAll           Entity = "all"
	EntityWorld         Entity = "world"
	EntityHost          Entity = "host"
	EntityUnmanaged     Entity = "unmanaged"
	EntityHealth        Entity = "health"
	EntityInit          Entity = "init"
	EntityRemoteNode    Entity = "remote-node"
	EntityKubeAPIServer Entity = "kube-apiserver"
	EntityIngress       Entity = "ingress"
	EntityCluster       Entity = "cluster"
)

// reservedEntities are the entities that are one reserved identity.
var reservedEntities = map[Entity]Number{
	EntityHost: Host, EntityUnmanaged: Unmanaged, EntityHealth: Health, EntityInit: Init,
	EntityRemoteNode: RemoteNode, EntityKubeAPIServer: KubeAPIServer, EntityIngress: Ingress,
}

// Reserved returns the reserved identity of an entity that is one (host,
// remote-node, ...): not all, world and cluster.
func (e Entity) Reserved() (Number, bool) {
	n, ok := reservedEntities[e]
	return n, ok
}

// ReservedLabel returns the label every identity of the entity carries:
// "reserved:<entity>".
func (e Entity) ReservedLabel() string { return "reserved:" + string(e) }

// ClusterEntities are the reserved entities Cilium's cluster entity
// selects besides every endpoint of the cluster.
func ClusterEntities() []Entity {
	return []Entity{EntityHost, EntityRemoteNode, EntityInit, EntityIngress, EntityHealth, EntityUnmanaged}
}
