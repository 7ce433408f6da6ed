// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"iter"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

// The program's endpoint_absent (bpf/enforce.c): one bit per slot of
// endpoint addresses, set when no address of that slot is in the
// endpoints map, so that a packet whose endpoint address falls there
// skips that map's lookup. A new program has every bit clear, which skips
// nothing; the endpoints writer clears a slot's bit before it writes an
// address of the slot, and sets it only once the slot's last address
// is deleted.
const (
	endpointSlotBits = 16         // ENDPOINT_SLOT_BITS
	endpointSlotMul  = 0x9e3779b1 // ENDPOINT_SLOT_MUL
)

// endpointFilter is the value of endpoint_absent.
type endpointFilter [(1 << endpointSlotBits) / 64]uint64

// endpointSlot is the slot of an endpoints map key, as endpoint_slot in
// the program computes it: the address's 32-bit words as the program
// loads them (little-endian, the object's byte order) folded by xor (an
// IPv4 key's words past the address are zero), times the multiplier, its
// top bits. A device key's slot is its ifindex's, the word where an IPv4
// key has the address.
func endpointSlot(k bpfmaps.EndpointKey) uint32 {
	var folded uint32
	for off := 4; off < len(k); off += 4 {
		folded ^= binary.LittleEndian.Uint32(k[off : off+4])
	}
	return (folded * endpointSlotMul) >> (32 - endpointSlotBits)
}

// absentExcept is the filter with every slot absent but those of keys.
func absentExcept(keys ...iter.Seq[bpfmaps.EndpointKey]) *endpointFilter {
	var f endpointFilter
	for i := range f {
		f[i] = ^uint64(0)
	}
	for _, seq := range keys {
		for k := range seq {
			s := endpointSlot(k)
			f[s/64] &^= 1 << (s % 64)
		}
	}
	return &f
}

// deviceKeys are the device keys (bpfmaps.NewEndpointDeviceKey) of the
// devices and of those the entries of each map are bound to.
func deviceKeys(devices map[uint32]struct{}, bound ...map[bpfmaps.EndpointKey]bpfmaps.EndpointValue) iter.Seq[bpfmaps.EndpointKey] {
	return func(yield func(bpfmaps.EndpointKey) bool) {
		for ifindex := range devices {
			if !yield(bpfmaps.NewEndpointDeviceKey(ifindex)) {
				return
			}
		}
		for _, m := range bound {
			for _, v := range m {
				if v.Ifindex() != 0 && !yield(bpfmaps.NewEndpointDeviceKey(v.Ifindex())) {
					return
				}
			}
		}
	}
}

// endpointWords are the program's endpoint_words (bpf/enforce.c) by
// slot, those not 0: a slot's one IPv4 address of the endpoints map and
// its entry in one word, which the program reads instead of looking the
// address up.
type endpointWords map[uint32]uint64

// endpointWord is the word of an IPv4 address's entry (bits 0-31 the
// address as the program loads it, 32-47 the identity, 48-63 the device),
// and whether the entry fits in one: an identity and a device below
// 65536, an identity not 0 (the program takes a word of identity 0 for
// none).
func endpointWord(k bpfmaps.EndpointKey, v bpfmaps.EndpointValue) (uint64, bool) {
	id, ifindex := uint32(v.Identity()), v.Ifindex()
	if id == 0 || id > 0xffff || ifindex > 0xffff {
		return 0, false
	}
	return uint64(binary.LittleEndian.Uint32(k[4:8])) | uint64(id)<<32 | uint64(ifindex)<<48, true
}

// endpointWordsOf are the words of entries, of the slots where keys (the
// keys of entries, and any other the map may hold meanwhile) have one
// IPv4 address: a slot of two is looked up in the map, which tells them
// apart.
func endpointWordsOf(entries map[bpfmaps.EndpointKey]bpfmaps.EndpointValue, keys ...iter.Seq[bpfmaps.EndpointKey]) endpointWords {
	addrs := map[uint32]int{}
	seen := map[bpfmaps.EndpointKey]bool{}
	countKey := func(k bpfmaps.EndpointKey) {
		if a, err := k.Addr(); seen[k] || err != nil || !a.Is4() {
			return
		}
		seen[k] = true
		addrs[endpointSlot(k)]++
	}
	for k := range entries {
		countKey(k)
	}
	for _, seq := range keys {
		for k := range seq {
			countKey(k)
		}
	}
	words := endpointWords{}
	for k, v := range entries {
		s := endpointSlot(k)
		if addrs[s] != 1 || !seen[k] {
			continue
		}
		if w, ok := endpointWord(k, v); ok {
			words[s] = w
		}
	}
	return words
}
