// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The BPF map layouts are an ABI shared with the enforcement program
// (bpf/enforce.c) and with other tools that read the pinned maps; see
// docs/CONTRACT.md, "BPF maps and pins". All integers are little-endian (host order on the
// supported architectures) except addresses and ports, which are in network
// order. Keys are written in canonical form: host bits zero, cluster_id 0.
//
// ipcache (LPM trie, BPF_F_NO_PREALLOC), as Cilium's ipcache_key and
// remote_endpoint_info:
//
//	key   (24 bytes): prefixlen u32 | cluster_id u16 | pad u8 | family u8 | ip [16]u8
//	value (24 bytes): sec_identity u32 | tunnel_endpoint [16]u8 | pad u16 | key u8 | flags u8
//
// prefixlen counts the 32 bits before ip (cluster_id, pad, family) plus the
// IP prefix length, so that the trie matches family exactly. IPv4 addresses
// take the first 4 bytes of ip.
//
// policy (LPM trie, BPF_F_NO_PREALLOC):
//
//	key   (12 bytes): prefixlen u32 | sec_identity u32 | direction u8 | protocol u8 | dport be16
//	value (8 bytes):  verdict u32 | pad u32
//
// prefixlen counts the bits after it that must match
// (PolicyPrefixLen): 40 identity and direction (any
// protocol), 48 also the protocol (any port), 48+n also the first n bits
// of dport. sec_identity 0 is any identity. direction: 0 ingress, 1
// egress (policy.Direction). For ICMP and ICMPv6 dport holds the type
// in its first byte and the code in its second. Bits past prefixlen are
// zero. verdict 1 allow, 2 deny, 3 allow with the DNS (port 53) that the
// endpoint sends steered to the DNS proxy (policy.Verdict; dns-proxy
// below). Of the two lookups, a deny wins, then a dns-proxy of either,
// then an allow of either (policy.Resolve).
//
// policy is an LPM trie of that layout per subject: the outer pinned map
// `policy` is a hash of maps (BPF_F_NO_PREALLOC) keyed by the subject, u32,
// the identity of the local endpoint whose policy the inner map holds (0:
// the host-wide default, for traffic of no local endpoint); each inner map
// is an LPM trie of the key and value above (PolicySpec). Endpoints of one
// identity select the same policies, so they share one inner map. Subjects
// are 0 and the label identities (identity.MinCluster..MaxCluster): the
// outer map holds PolicySubjects entries, every number below 65536.
//
// enforcement (array, 2 * PolicySubjects entries):
//
//	key   (4 bytes): index u32 = subject * 2 + direction
//	value (4 bytes): mode u32
//
// subject is 0 (the host-wide default) or a label identity, direction 0
// ingress, 1 egress: the default's two entries are at 0 and 1, where the
// previous layout (an array of 2) had them. mode 0 not enforced (traffic
// passes, nothing is looked up), 1 enforced with default deny (only what
// policy allows passes), 2 deny rules only (what a deny entry matches is
// dropped, the rest passes), 3 (an endpoint's direction whose policy map
// lacks a deny it had no room for) every IP packet dropped. A subject
// nobody wrote is 0: not enforced.
// The entries of TaggedSubject (255: below the label identities, and no
// endpoint's) are not a subject's: the agent keeps a direction's at 1
// while any endpoint's entry in that direction is not 0, and the program
// drops a frame with a VLAN tag left in it in that direction (the tag
// hides the address that says whose traffic it is).
// An array rather than a hash keyed by subject and direction: the
// program looks it up for every packet, and an array's lookup is inlined
// by the verifier where a hash's is a hash computation and a bucket walk,
// which was most of what subjects added to an established connection's
// packet (datapathcell's EnforcementPerPacket).
//
// endpoints (hash, BPF_F_NO_PREALLOC, EndpointsMaxEntries): every address
// of every local endpoint.
//
//	key   (20 bytes): family u8 | pad [3]u8 | addr [16]u8
//	value (12 bytes): identity u32 | ifindex u32 | flags u32
//
// family 1 IPv4 (in the first 4 bytes of addr, the rest zero), 2 IPv6,
// 3 a device that endpoints are bound to (its ifindex, u32 little endian,
// in the first 4 bytes of addr, the rest zero; the value's identity 0 and
// ifindex the device's): what such a device sends from an address that
// is no endpoint's is dropped as spoofed (ReasonSpoofedSource), except
// IPv6 neighbour discovery.
// identity is the endpoint's (its subject); ifindex the device it is
// bound to, 0 any device; flags 0 (none defined yet). The program finds
// a packet's local endpoint here (the source of what a device sends, the
// destination of what it receives); no entry is the host-wide default. A
// packet from another device than an endpoint's ifindex that carries its
// address as the source is dropped (ReasonSpoofedSource).
//
// counters (per-CPU array, 16 entries of 16 bytes: packets u64 | bytes
// u64, bytes being skb->len): index direction*8 + slot. Slot 0 counts
// allowed packets, slots 1-7 drops of ReasonNoPolicy, ReasonMalformed,
// ReasonPolicyDeny, ReasonVLANTagged, ReasonExtHeaders, ReasonFragment and
// ReasonSpoofedSource (a drop's slot is its reason code, events.go):
//
//	0 ingress allowed   1-7 ingress drops by reason
//	8 egress allowed    9-15 egress drops by reason
//
// A pinned counters map of the previous layout (8 entries, index
// direction*4 + slot) is migrated to this one at start (maps.go).
//
// dns-proxy (array, 1 entry; the program declares it as dns_proxy, for a
// C name has no '-'):
//
//	key   (4 bytes): u32 0
//	value (4 bytes): port u32
//
// port is the DNS proxy's port in host order (its UDP and TCP sockets
// listen on it, IPv4 and IPv6), written by the agent once the proxy
// listens; 0 is no proxy, and so is a value above 65535. The program
// steers the DNS of policy entries of verdict 3 there (datapathcell/bpf/enforce.c);
// without a proxy, or with no socket on the port (the agent down), that
// DNS goes to its server.

const (
	ipcacheKeySize   = 24
	ipcacheValueSize = 24
	policyKeySize    = 12
	policyValueSize  = 8

	// policyKeyStaticPrefixBits covers sec_identity and direction: the
	// prefix length of an any-protocol key.
	policyKeyStaticPrefixBits = 40
	// policyKeyMaxPrefixBits covers the whole key after prefixlen.
	policyKeyMaxPrefixBits = 64

	// ipcacheKeyStaticPrefixBits covers cluster_id, pad and family.
	ipcacheKeyStaticPrefixBits = 32

	familyIPv4   = 1
	familyIPv6   = 2
	familyDevice = 3

	endpointKeySize   = 20
	endpointValueSize = 12

	dnsProxyValueSize = 4
)

// PolicySubjects is the max entries of the outer policy map: every
// possible subject (0 and the label identities up to identity.MaxCluster)
// fits, so inserting a subject's inner map never fails for room.
const PolicySubjects = uint32(identity.MaxCluster) + 1

// EndpointsMaxEntries is the max entries of the endpoints map: the
// addresses of the local endpoints (two per endpoint, IPv4 and IPv6,
// for as many endpoints as there are label identities).
const EndpointsMaxEntries = 2 * PolicySubjects

// EndpointKey is the key of the endpoints map.
type EndpointKey [endpointKeySize]byte

// EndpointValue is the value of the endpoints map.
type EndpointValue [endpointValueSize]byte

// NewEndpointKey encodes an address (an IPv4-mapped IPv6 address is
// encoded as IPv4, as the program reads it from an IPv4 header).
func NewEndpointKey(addr netip.Addr) EndpointKey {
	var k EndpointKey
	addr = addr.Unmap()
	if addr.Is4() {
		k[0] = familyIPv4
		a := addr.As4()
		copy(k[4:8], a[:])
	} else {
		k[0] = familyIPv6
		a := addr.As16()
		copy(k[4:20], a[:])
	}
	return k
}

// NewEndpointDeviceKey encodes the key that says endpoints are bound to
// the device ifindex.
func NewEndpointDeviceKey(ifindex uint32) EndpointKey {
	var k EndpointKey
	k[0] = familyDevice
	binary.LittleEndian.PutUint32(k[4:8], ifindex)
	return k
}

// Device returns the device of a key of NewEndpointDeviceKey, and whether
// the key is one.
func (k EndpointKey) Device() (ifindex uint32, ok bool) {
	if k[0] != familyDevice {
		return 0, false
	}
	return binary.LittleEndian.Uint32(k[4:8]), true
}

// Addr decodes the key of an address.
//
// Possible errors: the key is not in canonical form (unknown family,
// nonzero pad, an IPv4 key with bytes past the address), or is a
// device's (Device).
func (k EndpointKey) Addr() (netip.Addr, error) {
	if k[1] != 0 || k[2] != 0 || k[3] != 0 {
		return netip.Addr{}, fmt.Errorf("decode endpoint key %x: nonzero pad", k)
	}
	switch k[0] {
	case familyIPv4:
		for _, b := range k[8:] {
			if b != 0 {
				return netip.Addr{}, fmt.Errorf("decode endpoint key %x: IPv4 key with bytes past the address", k)
			}
		}
		return netip.AddrFrom4([4]byte(k[4:8])), nil
	case familyIPv6:
		return netip.AddrFrom16([16]byte(k[4:20])), nil
	}
	return netip.Addr{}, fmt.Errorf("decode endpoint key %x: unknown family %d", k, k[0])
}

// NewEndpointValue encodes an endpoint's identity and the device it is
// bound to (ifindex 0: any device). No flags are defined.
func NewEndpointValue(ident identity.Number, ifindex uint32) EndpointValue {
	var v EndpointValue
	binary.LittleEndian.PutUint32(v[0:4], uint32(ident))
	binary.LittleEndian.PutUint32(v[4:8], ifindex)
	return v
}

// Identity returns the endpoint's identity: the subject of its traffic.
func (v EndpointValue) Identity() identity.Number {
	return identity.Number(binary.LittleEndian.Uint32(v[0:4]))
}

// Ifindex returns the device the endpoint is bound to, 0 for any.
func (v EndpointValue) Ifindex() uint32 { return binary.LittleEndian.Uint32(v[4:8]) }

// Flags returns the value's flags (none defined yet: 0).
func (v EndpointValue) Flags() uint32 { return binary.LittleEndian.Uint32(v[8:12]) }

// DNSProxyValue is the value of the dns-proxy map (at key uint32(0)).
type DNSProxyValue [dnsProxyValueSize]byte

// NewDNSProxyValue encodes the DNS proxy's port; 0 is no proxy.
func NewDNSProxyValue(port uint16) DNSProxyValue {
	var v DNSProxyValue
	binary.LittleEndian.PutUint32(v[:], uint32(port))
	return v
}

// Port returns the DNS proxy's port, 0 for none (also for a value above
// 65535, which the program takes as none).
func (v DNSProxyValue) Port() uint16 {
	port := binary.LittleEndian.Uint32(v[:])
	if port > 0xffff {
		return 0
	}
	return uint16(port)
}

// EnforcementKey is the key of the enforcement map: the index of a
// subject's direction.
type EnforcementKey uint32

// TaggedSubject is the slot of the enforcement map that is on in a
// direction while any endpoint's is: there the program drops VLAN-tagged
// frames, whose endpoint it cannot tell (see the layout above).
const TaggedSubject identity.Number = 255

// NewEnforcementKey encodes a subject's direction (the subject is below
// PolicySubjects).
func NewEnforcementKey(subject identity.Number, direction policy.Direction) EnforcementKey {
	return EnforcementKey(uint32(subject)*2 + uint32(direction))
}

// Subject returns the key's subject.
func (k EnforcementKey) Subject() identity.Number { return identity.Number(k / 2) }

// Direction returns the key's direction.
func (k EnforcementKey) Direction() policy.Direction { return policy.Direction(k % 2) }

// IPCacheKey is the key of the ipcache map.
type IPCacheKey [ipcacheKeySize]byte

// IPCacheValue is the value of the ipcache map.
type IPCacheValue [ipcacheValueSize]byte

// PolicyKey is the key of the policy map.
type PolicyKey [policyKeySize]byte

// PolicyValue is the value of the policy map.
type PolicyValue [policyValueSize]byte

// NewIPCacheKey encodes a prefix in canonical form.
func NewIPCacheKey(prefix netip.Prefix) IPCacheKey {
	var k IPCacheKey
	prefix = prefix.Masked()
	binary.LittleEndian.PutUint32(k[0:4], uint32(ipcacheKeyStaticPrefixBits+prefix.Bits()))
	// k[4:6] cluster_id = 0, k[6] pad = 0
	addr := prefix.Addr()
	if addr.Is4() {
		k[7] = familyIPv4
		a := addr.As4()
		copy(k[8:12], a[:])
	} else {
		k[7] = familyIPv6
		a := addr.As16()
		copy(k[8:24], a[:])
	}
	return k
}

// Prefix decodes the key.
//
// Possible errors: the key is not in canonical form (unknown family, bad
// prefix length, nonzero cluster_id, pad or host bits).
func (k IPCacheKey) Prefix() (netip.Prefix, error) {
	prefix, err := k.decode()
	if err == nil && prefix.Masked() != prefix {
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: host bits set", k)
	}
	return prefix, err
}

// decode decodes the key, host bits and all: the kernel's trie matches only
// the prefix's bits, so a key with host bits set is the entry of its
// masked prefix.
//
// The errors format the key by value, not as k[:]: a slice of k would
// move every key decoded to the heap, and the writer decodes one per
// lookup of what the map held at start (mapwrite.NewSnapshotValues).
func (k IPCacheKey) decode() (netip.Prefix, error) {
	bits := int(binary.LittleEndian.Uint32(k[0:4])) - ipcacheKeyStaticPrefixBits
	if k[4] != 0 || k[5] != 0 || k[6] != 0 {
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: nonzero cluster_id or pad", k)
	}
	var addr netip.Addr
	switch k[7] {
	case familyIPv4:
		addr = netip.AddrFrom4([4]byte(k[8:12]))
		for _, b := range k[12:] {
			if b != 0 {
				return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: IPv4 key with bytes past the address", k)
			}
		}
	case familyIPv6:
		addr = netip.AddrFrom16([16]byte(k[8:24]))
	default:
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: unknown family %d", k, k[7])
	}
	if bits < 0 || bits > addr.BitLen() {
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: prefix length %d out of range", k, bits)
	}
	return netip.PrefixFrom(addr, bits), nil
}

// Compare orders keys by family and address, then prefix length: the
// order of a trie walk, in which the kernel's LPM trie inserts fastest.
func (k IPCacheKey) Compare(other IPCacheKey) int {
	if c := bytes.Compare(k[4:], other[4:]); c != 0 {
		return c
	}
	return cmp.Compare(binary.LittleEndian.Uint32(k[0:4]), binary.LittleEndian.Uint32(other[0:4]))
}

// NewIPCacheValue encodes an identity. The tunnel endpoint, key and flags
// are zero: this agent does not tunnel.
func NewIPCacheValue(ident identity.Number) IPCacheValue {
	var v IPCacheValue
	binary.LittleEndian.PutUint32(v[0:4], uint32(ident))
	return v
}

// Identity returns the value's sec_identity.
func (v IPCacheValue) Identity() identity.Number {
	return identity.Number(binary.LittleEndian.Uint32(v[0:4]))
}

// NewPolicyKey encodes key in canonical form: prefixlen is
// PolicyPrefixLen(key), and the bits past it are zero (a protocol of an
// any-protocol key, the wildcard bits of the port). Port is in host order;
// it is stored in network order.
func NewPolicyKey(key policy.Key) PolicyKey {
	var k PolicyKey
	prefixLen := PolicyPrefixLen(key)
	binary.LittleEndian.PutUint32(k[0:4], prefixLen)
	binary.LittleEndian.PutUint32(k[4:8], uint32(key.Identity))
	k[8] = uint8(key.Direction)
	if prefixLen > policyKeyStaticPrefixBits {
		k[9] = uint8(key.Protocol)
		portBits := prefixLen - policyKeyStaticPrefixBits - 8
		binary.BigEndian.PutUint16(k[10:12], key.Port&^(0xffff>>portBits))
	}
	return k
}

// Key decodes the key: the inverse of NewPolicyKey.
//
// Possible errors: the key is not in canonical form (a prefix length that
// no policy.Key has, or bits set past it).
func (k PolicyKey) Key() (policy.Key, error) {
	prefixLen := binary.LittleEndian.Uint32(k[0:4])
	key := policy.Key{
		Identity:  identity.Number(binary.LittleEndian.Uint32(k[4:8])),
		Direction: policy.Direction(k[8]),
		Protocol:  policy.Protocol(k[9]),
		Port:      binary.BigEndian.Uint16(k[10:12]),
	}
	switch {
	case prefixLen == policyKeyStaticPrefixBits:
		if key.Protocol != 0 || key.Port != 0 {
			return policy.Key{}, fmt.Errorf("decode policy key %x: bits set past prefix length %d", k[:], prefixLen)
		}
	case prefixLen >= policyKeyStaticPrefixBits+8 && prefixLen <= policyKeyMaxPrefixBits && key.Protocol != 0:
		key.PortWildcardBits = uint8(policyKeyMaxPrefixBits - prefixLen)
	default:
		return policy.Key{}, fmt.Errorf("decode policy key %x: prefix length %d out of range", k[:], prefixLen)
	}
	if NewPolicyKey(key) != k {
		return policy.Key{}, fmt.Errorf("decode policy key %x: bits set past prefix length %d", k[:], prefixLen)
	}
	return key, nil
}

// Fields decodes the key's fields as they are stored; dport is returned in
// host order. Key also gives the prefix length, as PortWildcardBits.
func (k PolicyKey) Fields() (ident identity.Number, direction, protocol uint8, dport uint16) {
	return identity.Number(binary.LittleEndian.Uint32(k[4:8])), k[8], k[9], binary.BigEndian.Uint16(k[10:12])
}

// NewPolicyValue encodes a verdict.
func NewPolicyValue(verdict uint32) PolicyValue {
	var v PolicyValue
	binary.LittleEndian.PutUint32(v[0:4], verdict)
	return v
}

// Verdict returns the value's verdict.
func (v PolicyValue) Verdict() uint32 { return binary.LittleEndian.Uint32(v[0:4]) }

// PolicyPrefixLen is the key's prefix length in the policy map: the bits of
// identity and direction (40), then the protocol's (8), then the port's
// that must match.
func PolicyPrefixLen(k policy.Key) uint32 {
	if k.Protocol == policy.ProtocolAny {
		return 40
	}
	return 48 + 16 - uint32(k.PortWildcardBits)
}

// EnforcementValue is the enforcement map's value: whether and how a
// direction is enforced (see the layout above).
type EnforcementValue uint32

// The enforcement map's values.
const (
	EnforceNone        EnforcementValue = 0
	EnforceDefaultDeny EnforcementValue = 1
	EnforceDenyOnly    EnforcementValue = 2
	// EnforceDropAll is an endpoint's direction whose policy map lacks a
	// deny it had no room for: everything is dropped until it fits.
	EnforceDropAll EnforcementValue = 3
)

// PolicyKeyAt is key cut to prefixLen bits (as PolicyPrefixLen counts
// them): the key of the entry of that prefix length that the program's
// lookup of key finds.
func PolicyKeyAt(key policy.Key, prefixLen uint32) policy.Key {
	if prefixLen <= policyKeyStaticPrefixBits {
		return policy.Key{Identity: key.Identity, Direction: key.Direction}
	}
	key.PortWildcardBits = uint8(policyKeyMaxPrefixBits - prefixLen)
	return key
}
