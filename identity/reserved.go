// SPDX-License-Identifier: Apache-2.0

package identity

// reservedByNumber is the entity of each reserved identity, World's
// included.
var reservedByNumber = map[Number]Entity{
	Host: EntityHost, World: EntityWorld, Unmanaged: EntityUnmanaged, Health: EntityHealth, Init: EntityInit,
	RemoteNode: EntityRemoteNode, KubeAPIServer: EntityKubeAPIServer, Ingress: EntityIngress,
}

// ReservedEntity returns the entity of a reserved identity (world for
// World, host for Host...). Unknown (0) is no identity, and has none.
func (id Number) ReservedEntity() (Entity, bool) {
	e, ok := reservedByNumber[id]
	return e, ok
}

// ReservedNumbers returns the reserved identities, in order: Host (1) to
// Ingress (8).
func ReservedNumbers() []Number {
	return []Number{Host, World, Unmanaged, Health, Init, RemoteNode, KubeAPIServer, Ingress}
}
