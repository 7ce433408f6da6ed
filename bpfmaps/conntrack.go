// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// conntrack (hash, --conntrack-map-max-entries) and ct_opening (LRU hash,
// --conntrack-opening-map-max-entries), written by the enforcement program
// (bpf/enforce.c says when), read and collected by the agent. A new
// connection's entry is made in ct_opening; it moves to conntrack when its
// origin sends a packet after a reply (the last packet of a TCP
// handshake), so that a flood of new connections churns ct_opening only
// and never evicts an established connection. A full conntrack leaves the
// connection in ct_opening, and the program counts it (ConntrackFull).
// Both have this layout:
//
//	key   (44 bytes): endpoint_addr [16]u8 | remote_addr [16]u8 | endpoint_port be16 |
//	                  remote_port be16 | protocol u8 | family u8 | subject u16 | ifindex u32
//	value (16 bytes): expires u64 | origin u8 | flags u8 | checked 48 bits (u16 | u32)
//
// The endpoint is the side behind the device, the remote the other one;
// IPv4 addresses take the first 4 bytes. ICMP and ICMPv6 echo put the echo
// identifier in endpoint_port, remote_port is 0. subject is the low 16
// bits of the subject (abi.go: the local endpoint's identity, 0 the
// host-wide default; subjects are below 65536) whose policy the
// connection is under: a reply is one only for that subject. ifindex is the device the
// entry was created on: a connection is only itself on that device, so a
// packet on another device that carries the same addresses and ports
// neither finds nor creates its entry. expires is in
// CLOCK_MONOTONIC_COARSE nanoseconds (bpf_ktime_get_coarse_ns). origin is the direction
// of the packet that created the entry (0 ingress, 1 egress): packets the
// other way are its replies. flags: ConntrackEstablished,
// ConntrackFINOrigin, ConntrackFINReply, ConntrackRST, ConntrackReplySeen,
// ConntrackRevoked.
// checked is the second little-endian u64 shifted right by 16: the low 48
// bits of the revision (revision.go) at which policy last allowed a
// forward packet, 0 if never (a direction not enforced creates entries
// without a verdict).
const (
	conntrackKeySize   = 44
	conntrackValueSize = 16
)

// Flags of a conntrack entry.
const (
	// ConntrackEstablished: TCP, a packet without SYN was seen.
	ConntrackEstablished = 0x01
	// ConntrackFINOrigin: TCP, the origin side sent a FIN.
	ConntrackFINOrigin = 0x02
	// ConntrackFINReply: TCP, the reply side sent a FIN.
	ConntrackFINReply = 0x04
	// ConntrackRST: TCP, either side sent a RST.
	ConntrackRST = 0x08
	// ConntrackReplySeen: a reply passed.
	ConntrackReplySeen = 0x10
	// ConntrackRevoked: policy dropped a forward packet since it last
	// allowed one. Packets the other way are then no replies, and the
	// entry stays so that they cannot open a connection of the other
	// origin in a direction that is not enforced.
	ConntrackRevoked = 0x20
)

// ConntrackKey is the key of the conntrack map.
type ConntrackKey [conntrackKeySize]byte

// ConntrackValue is the value of the conntrack map.
type ConntrackValue [conntrackValueSize]byte

// NewConntrackKey encodes the key of a connection on the device ifindex.
// Both addresses must be of the same family; ports are in host order.
func NewConntrackKey(ifindex uint32, endpoint, remote netip.AddrPort, protocol uint8) ConntrackKey {
	var k ConntrackKey
	binary.NativeEndian.PutUint32(k[40:44], ifindex)
	if endpoint.Addr().Is4() {
		a, b := endpoint.Addr().As4(), remote.Addr().As4()
		copy(k[0:4], a[:])
		copy(k[16:20], b[:])
		k[37] = familyIPv4
	} else {
		a, b := endpoint.Addr().As16(), remote.Addr().As16()
		copy(k[0:16], a[:])
		copy(k[16:32], b[:])
		k[37] = familyIPv6
	}
	binary.BigEndian.PutUint16(k[32:34], endpoint.Port())
	binary.BigEndian.PutUint16(k[34:36], remote.Port())
	k[36] = protocol
	return k
}

// Fields decodes the key.
//
// Possible errors: unknown family.
func (k ConntrackKey) Fields() (endpoint, remote netip.AddrPort, protocol uint8, err error) {
	var a, b netip.Addr
	switch k[37] {
	case familyIPv4:
		a, b = netip.AddrFrom4([4]byte(k[0:4])), netip.AddrFrom4([4]byte(k[16:20]))
	case familyIPv6:
		a, b = netip.AddrFrom16([16]byte(k[0:16])), netip.AddrFrom16([16]byte(k[16:32]))
	default:
		return netip.AddrPort{}, netip.AddrPort{}, 0, fmt.Errorf("decode conntrack key %x: unknown family %d", k[:], k[37])
	}
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(k[32:34])),
		netip.AddrPortFrom(b, binary.BigEndian.Uint16(k[34:36])), k[36], nil
}

// NewConntrackValue encodes an entry's value; expires is CLOCK_MONOTONIC_COARSE.
func NewConntrackValue(expires time.Duration, origin, flags uint8) ConntrackValue {
	var v ConntrackValue
	binary.LittleEndian.PutUint64(v[0:8], uint64(expires))
	v[8] = origin
	v[9] = flags
	return v
}

// Expires is the CLOCK_MONOTONIC_COARSE time after which the entry is dead.
func (v ConntrackValue) Expires() time.Duration {
	return time.Duration(binary.LittleEndian.Uint64(v[0:8]))
}

// Origin is the direction of the packet that created the entry.
func (v ConntrackValue) Origin() uint8 { return v[8] }

// Flags are the entry's Conntrack* flags.
func (v ConntrackValue) Flags() uint8 { return v[9] }

// Checked is the revision (the revision map) at which policy last allowed
// the entry's forward direction, 0 if never.
func (v ConntrackValue) Checked() uint64 { return binary.LittleEndian.Uint64(v[8:16]) >> 16 }

// previousConntrackKeySize is the key size of the layout before the
// device was part of the key: the same fields without ifindex.
const previousConntrackKeySize = 40

// convertPreviousConntrack replaces a pinned conntrack map of the previous
// layout by one of spec's, holding its entries once per device of devices
// (resolved in the agent's namespace; a device that does not exist gets
// none). It returns nil and no error when the pin is not of that layout.
//
// Possible errors: the old map cannot be read; the new one cannot be
// created, filled or pinned.
func convertPreviousConntrack(dir string, spec *ebpf.MapSpec, devices []string, log *slog.Logger) (*ebpf.Map, error) {
	path := filepath.Join(dir, spec.Name)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, nil // openPinnedMap says what it is
	}
	defer old.Close()
	if old.Type() != ebpf.LRUHash || old.KeySize() != previousConntrackKeySize || old.ValueSize() != spec.ValueSize {
		return nil, nil
	}
	var ifindexes []uint32
	for _, name := range devices {
		if iface, err := net.InterfaceByName(name); err == nil {
			ifindexes = append(ifindexes, uint32(iface.Index))
		}
	}
	log.Info("Converting pinned conntrack map to the layout with the device in the key",
		"map", path, "devices", len(ifindexes))
	return replacePinnedWith(spec, path, old, func(from, to *ebpf.Map) error {
		var k [previousConntrackKeySize]byte
		var v ConntrackValue
		it := from.Iterate()
		for it.Next(&k, &v) {
			var nk ConntrackKey
			copy(nk[:], k[:])
			for _, ifindex := range ifindexes {
				binary.NativeEndian.PutUint32(nk[40:44], ifindex)
				// What does not fit is left out: those connections'
				// next forward packets make their entries again.
				if err := to.Put(nk, v); errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOMEM) {
					return it.Err()
				} else if err != nil {
					return err
				}
			}
		}
		return it.Err()
	})
}

// openConntrackMaps opens, creates, migrates or replaces the pinned
// conntrack and ct_opening maps as openPinnedMaps does the others, so that
// connections keep their entries across restarts. A migration copies the
// entries (into a smaller map, what fits); entries the program creates in
// the old map while the copy runs are lost, and those connections'
// replies are decided by policy until their next forward packet. A
// conntrack map of the previous layout (an LRU hash with 40-byte keys,
// without the device) is converted: each entry is copied into the
// conntrack map once for every device in --devices, since the old key
// does not say which device its connection was on; the copies on other
// devices are never matched and expire. The two are opened at once: each
// preallocates its entries.
//
// Possible errors (in the result): as openPinnedMaps; both maps are open
// (or nil) then, for close.
func openConntrackMaps(dir string, maxEntries, openingMaxEntries uint32, devices []string, log *slog.Logger) conntrackMaps {
	var (
		maps       conntrackMaps
		openingErr error
		wg         sync.WaitGroup
	)
	wg.Go(func() { maps.opening, openingErr = openPinnedMap(dir, ConntrackOpeningSpec(openingMaxEntries), log) })
	spec := ConntrackSpec(maxEntries)
	maps.conntrack, maps.err = convertPreviousConntrack(dir, spec, devices, log)
	if maps.err == nil && maps.conntrack == nil {
		maps.conntrack, maps.err = openPinnedMap(dir, spec, log)
	}
	wg.Wait()
	maps.err = errors.Join(maps.err, openingErr)
	return maps
}

// conntrackMaps are the result of openConntrackMaps.
type conntrackMaps struct {
	conntrack, opening *ebpf.Map
	err                error
}

// close closes the maps that were opened (Close of a nil map does
// nothing).
func (c conntrackMaps) close() {
	c.conntrack.Close()
	c.opening.Close()
}
