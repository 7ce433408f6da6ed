// SPDX-License-Identifier: Apache-2.0

package craft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// The VLAN tag protocol identifiers (EtherTypes) of Tag.TPID.
const (
	TPID8021Q  = 0x8100 // 802.1Q, a customer tag
	TPID8021AD = 0x88a8 // 802.1ad, a service (outer) tag
)

// Tag is a VLAN tag written in the frame (in-band), not in skb metadata.
// VID 0 is a priority tag, which the receiving kernel strips whether or not
// a VLAN device exists.
type Tag struct {
	TPID uint16
	VID  uint16
}

// Link is the Ethernet source and destination a frame is sent with.
type Link struct {
	Src, Dst net.HardwareAddr
}

// Serialize writes an IP packet from layers, outermost first: an IPv4 or
// IPv6 layer, then what it carries (TCP, UDP, ICMPv4, ICMPv6,
// DestinationOptions, gopacket.Payload). Lengths and checksums are filled
// in (TCP, UDP and ICMPv6 over the first IP layer's pseudo-header), and
// left-zero fields get what the packet needs: IP version, a TTL or hop
// limit of 64, the IP protocol or next header of the layer that follows.
// The layers are modified in place.
//
// Possible errors: no IP layer first; gopacket's serialization errors.
func Serialize(ls ...gopacket.SerializableLayer) ([]byte, error) {
	// An empty chain is no layer: the IP header announces what follows it.
	ls = slices.DeleteFunc(slices.Clone(ls), func(l gopacket.SerializableLayer) bool {
		d, ok := l.(*DestinationOptions)
		return ok && d.Count == 0
	})
	if len(ls) == 0 {
		return nil, errors.New("serialize: no layers")
	}
	var network gopacket.NetworkLayer
	switch ip := ls[0].(type) {
	case *layers.IPv4:
		if ip.Version == 0 {
			ip.Version = 4
		}
		if ip.TTL == 0 {
			ip.TTL = 64
		}
		if ip.Protocol == 0 && len(ls) > 1 {
			ip.Protocol = protocolOf(ls[1])
		}
		network = ip
	case *layers.IPv6:
		if ip.Version == 0 {
			ip.Version = 6
		}
		if ip.HopLimit == 0 {
			ip.HopLimit = 64
		}
		if ip.NextHeader == 0 && len(ls) > 1 {
			ip.NextHeader = protocolOf(ls[1])
		}
		network = ip
	default:
		return nil, fmt.Errorf("serialize: first layer is %T, not IPv4 or IPv6", ls[0])
	}
	for i, l := range ls[1:] {
		switch l := l.(type) {
		case *layers.TCP:
			l.SetNetworkLayerForChecksum(network)
		case *layers.UDP:
			l.SetNetworkLayerForChecksum(network)
		case *layers.ICMPv6:
			l.SetNetworkLayerForChecksum(network)
		case *DestinationOptions:
			if l.Next == 0 && i+2 < len(ls) {
				l.Next = protocolOf(ls[i+2])
			}
		case *FragmentHeader:
			if l.Next == 0 && i+2 < len(ls) {
				l.Next = protocolOf(ls[i+2])
			}
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("serialize: %w", err)
	}
	return buf.Bytes(), nil
}

// MustSerialize is Serialize that panics on an error (a test's own layers
// are wrong).
func MustSerialize(ls ...gopacket.SerializableLayer) []byte {
	b, err := Serialize(ls...)
	if err != nil {
		panic(err)
	}
	return b
}

// protocolOf is the IP protocol number that announces l.
func protocolOf(l gopacket.SerializableLayer) layers.IPProtocol {
	switch l.(type) {
	case *layers.TCP:
		return layers.IPProtocolTCP
	case *layers.UDP:
		return layers.IPProtocolUDP
	case *layers.ICMPv4:
		return layers.IPProtocolICMPv4
	case *layers.ICMPv6:
		return layers.IPProtocolICMPv6
	case *DestinationOptions:
		return layers.IPProtocolIPv6Destination
	case *FragmentHeader:
		return layers.IPProtocolIPv6Fragment
	}
	return 0
}

// Ethernet frames the IP packet for link, behind tags (outermost first,
// written in the frame). The EtherType after the last tag is the packet's
// (IPv4 or IPv6, from its version nibble).
func Ethernet(link Link, packet []byte, tags ...Tag) []byte {
	frame := make([]byte, 0, 14+4*len(tags)+len(packet))
	frame = append(frame, link.Dst...)
	frame = append(frame, link.Src...)
	for _, tag := range tags {
		frame = binary.BigEndian.AppendUint16(frame, tag.TPID)
		frame = binary.BigEndian.AppendUint16(frame, tag.VID&0x0fff)
	}
	etherType := uint16(layers.EthernetTypeIPv4)
	if len(packet) > 0 && packet[0]>>4 == 6 {
		etherType = uint16(layers.EthernetTypeIPv6)
	}
	frame = binary.BigEndian.AppendUint16(frame, etherType)
	return append(frame, packet...)
}

// Quote is what an ICMP or ICMPv6 error carries of packet: its IP header
// (IPv4 with its options; IPv6's fixed 40 bytes, which is all of it for a
// packet without extension headers) and the first 8 bytes after it (the
// ports, or an echo's identifier), then extra, which a well-behaved router
// would not add: the room a covert payload finds in an error.
func Quote(packet []byte, extra []byte) []byte {
	n := 40 + 8
	if packet[0]>>4 == 4 {
		n = int(packet[0]&0x0f)*4 + 8
	}
	return append(packet[:n:n], extra...)
}

// DestinationOptions is a chain of Count IPv6 destination options headers
// (next header 60), eight bytes each (a PadN option filling it); the last
// announces Next (Serialize sets it from the layer that follows when it is
// zero). The IPv6 layer before it must announce 60 (Serialize sets that
// too). Serialize leaves out a chain of Count 0.
type DestinationOptions struct {
	Count int
	Next  layers.IPProtocol
}

var _ gopacket.SerializableLayer = (*DestinationOptions)(nil)

// LayerType is gopacket's payload type: gopacket has no type for a chain.
func (d *DestinationOptions) LayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// SerializeTo prepends the chain.
func (d *DestinationOptions) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	bytes, err := b.PrependBytes(8 * d.Count)
	if err != nil {
		return err
	}
	for i := range d.Count {
		h := bytes[8*i : 8*i+8]
		h[0] = byte(layers.IPProtocolIPv6Destination)
		if i == d.Count-1 {
			h[0] = byte(d.Next)
		}
		h[1] = 0          // length in 8-byte units after the first 8
		h[2], h[3] = 1, 4 // PadN with 4 bytes of padding
		clear(h[4:])
	}
	return nil
}

var markers atomic.Uint64

// Marker is a payload no other packet carries: the test's name for the
// packet, and a number unique in this process and run.
func Marker(name string) []byte {
	return fmt.Appendf(nil, "craft-marker %s %d-%d", name, time.Now().UnixNano(), markers.Add(1))
}
