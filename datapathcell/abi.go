// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
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
// policy (hash):
//
//	key   (8 bytes): sec_identity u32 | direction u8 | protocol u8 | dport be16
//	value (8 bytes): verdict u32 | pad u32
//
// direction: 0 ingress, 1 egress (policycell.Direction). protocol 0 and
// dport 0 mean any. verdict 1 is allow (policycell.VerdictAllow).
//
// enforcement (array, 2 entries, index = direction): value u32, 1 when the
// direction is enforced (some policy has a rule in it), else 0: traffic in
// a direction without rules passes.
//
// counters (per-CPU array, 8 entries of 16 bytes: packets u64 | bytes
// u64, bytes being skb->len): index direction*4 + slot. Slot 0 counts
// allowed packets, slot 1 drops of ReasonNoPolicy, slot 2 drops of
// ReasonMalformed (a drop's slot is its reason code, events.go), slot 3 is
// unused:
//
//	0 ingress allowed   1 ingress no-policy   2 ingress malformed   3 -
//	4 egress allowed    5 egress no-policy    6 egress malformed    7 -

const (
	ipcacheKeySize   = 24
	ipcacheValueSize = 24
	policyKeySize    = 8
	policyValueSize  = 8

	// ipcacheKeyStaticPrefixBits covers cluster_id, pad and family.
	ipcacheKeyStaticPrefixBits = 32

	familyIPv4 = 1
	familyIPv6 = 2
)

// IPCacheMapKey is the key of the ipcache map.
type IPCacheMapKey [ipcacheKeySize]byte

// IPCacheMapValue is the value of the ipcache map.
type IPCacheMapValue [ipcacheValueSize]byte

// PolicyMapKey is the key of the policy map.
type PolicyMapKey [policyKeySize]byte

// PolicyMapValue is the value of the policy map.
type PolicyMapValue [policyValueSize]byte

// NewIPCacheMapKey encodes a prefix in canonical form.
func NewIPCacheMapKey(prefix netip.Prefix) IPCacheMapKey {
	var k IPCacheMapKey
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
func (k IPCacheMapKey) Prefix() (netip.Prefix, error) {
	prefix, err := k.decode()
	if err == nil && prefix.Masked() != prefix {
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: host bits set", k[:])
	}
	return prefix, err
}

// decode decodes the key, host bits and all: the kernel's trie matches only
// the prefix's bits, so a key with host bits set is the entry of its
// masked prefix.
func (k IPCacheMapKey) decode() (netip.Prefix, error) {
	bits := int(binary.LittleEndian.Uint32(k[0:4])) - ipcacheKeyStaticPrefixBits
	if k[4] != 0 || k[5] != 0 || k[6] != 0 {
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: nonzero cluster_id or pad", k[:])
	}
	var addr netip.Addr
	switch k[7] {
	case familyIPv4:
		addr = netip.AddrFrom4([4]byte(k[8:12]))
		for _, b := range k[12:] {
			if b != 0 {
				return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: IPv4 key with bytes past the address", k[:])
			}
		}
	case familyIPv6:
		addr = netip.AddrFrom16([16]byte(k[8:24]))
	default:
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: unknown family %d", k[:], k[7])
	}
	if bits < 0 || bits > addr.BitLen() {
		return netip.Prefix{}, fmt.Errorf("decode ipcache key %x: prefix length %d out of range", k[:], bits)
	}
	return netip.PrefixFrom(addr, bits), nil
}

// compare orders keys by family and address, then prefix length: the
// order of a trie walk, in which the kernel's LPM trie inserts fastest.
func (k IPCacheMapKey) compare(other IPCacheMapKey) int {
	if c := bytes.Compare(k[4:], other[4:]); c != 0 {
		return c
	}
	return cmp.Compare(binary.LittleEndian.Uint32(k[0:4]), binary.LittleEndian.Uint32(other[0:4]))
}

// NewIPCacheMapValue encodes an identity. The tunnel endpoint, key and flags
// are zero: this agent does not tunnel.
func NewIPCacheMapValue(identity uint32) IPCacheMapValue {
	var v IPCacheMapValue
	binary.LittleEndian.PutUint32(v[0:4], identity)
	return v
}

// Identity returns the value's sec_identity.
func (v IPCacheMapValue) Identity() uint32 { return binary.LittleEndian.Uint32(v[0:4]) }

// NewPolicyMapKey encodes a policy key. dport is in host order; it is stored
// in network order.
func NewPolicyMapKey(identity uint32, direction, protocol uint8, dport uint16) PolicyMapKey {
	var k PolicyMapKey
	binary.LittleEndian.PutUint32(k[0:4], identity)
	k[4] = direction
	k[5] = protocol
	binary.BigEndian.PutUint16(k[6:8], dport)
	return k
}

// Fields decodes the key; dport is returned in host order.
func (k PolicyMapKey) Fields() (identity uint32, direction, protocol uint8, dport uint16) {
	return binary.LittleEndian.Uint32(k[0:4]), k[4], k[5], binary.BigEndian.Uint16(k[6:8])
}

// NewPolicyMapValue encodes a verdict.
func NewPolicyMapValue(verdict uint32) PolicyMapValue {
	var v PolicyMapValue
	binary.LittleEndian.PutUint32(v[0:4], verdict)
	return v
}

// Verdict returns the value's verdict.
func (v PolicyMapValue) Verdict() uint32 { return binary.LittleEndian.Uint32(v[0:4]) }
