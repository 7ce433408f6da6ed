// SPDX-License-Identifier: Apache-2.0

package craft

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// FragmentHeader is an IPv6 fragment header (next header 44): Offset is in
// bytes (a multiple of 8) of the fragmentable part, More the M flag, ID the
// datagram's identification. gopacket decodes IPv6Fragment but cannot
// write it. Next is the header that follows in the first fragment (for a
// later one, whatever the sender claims); Serialize sets it from the layer
// that follows when it is zero and one does.
type FragmentHeader struct {
	Next   layers.IPProtocol
	Offset int
	More   bool
	ID     uint32
}

var _ gopacket.SerializableLayer = (*FragmentHeader)(nil)

// LayerType is gopacket's IPv6 fragment layer type.
func (f *FragmentHeader) LayerType() gopacket.LayerType { return layers.LayerTypeIPv6Fragment }

// SerializeTo prepends the header.
func (f *FragmentHeader) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	if f.Offset%8 != 0 || f.Offset < 0 || f.Offset > 0xfff8 {
		return fmt.Errorf("fragment offset %d: not a multiple of 8 in 0..65528", f.Offset)
	}
	h, err := b.PrependBytes(8)
	if err != nil {
		return err
	}
	h[0] = byte(f.Next)
	h[1] = 0
	word := uint16(f.Offset)
	if f.More {
		word |= 1
	}
	binary.BigEndian.PutUint16(h[2:4], word)
	binary.BigEndian.PutUint32(h[4:8], f.ID)
	return nil
}

// ipHeaderLen is the length of packet's IP header: IPv4's with its
// options, IPv6's fixed 40 bytes.
func ipHeaderLen(packet []byte) int {
	if packet[0]>>4 == 4 {
		return int(packet[0]&0x0f) * 4
	}
	return 40
}

// Payload is what the IP packet carries after its IP header (for IPv6,
// after the fixed header: extension headers are payload here): the
// datagram's part that fragments carry.
func Payload(packet []byte) []byte { return packet[ipHeaderLen(packet):] }

// Fragment is one fragment of the datagram packet (from Serialize: IPv4,
// or IPv6 with the transport header right after the fixed header): the
// packet's addresses and protocol with identification id (IPv4 uses its
// low 16 bits), carrying data at byte offset (a multiple of 8) of the
// datagram's payload, with the more-fragments flag more. IPv6 fragments
// carry a fragment header (FragmentHeader) announcing the packet's next
// header. data need not be the datagram's own bytes: a fragment that
// overlaps another with other content, or one that rewrites the
// transport header at offset 0, is made the same way.
func Fragment(packet []byte, id uint32, offset int, more bool, data []byte) []byte {
	if offset%8 != 0 {
		panic(fmt.Sprintf("fragment offset %d is not a multiple of 8", offset))
	}
	if packet[0]>>4 == 4 {
		ip := &layers.IPv4{
			Version: 4, TOS: packet[1], Id: uint16(id), TTL: packet[8], Protocol: layers.IPProtocol(packet[9]),
			SrcIP: net.IP(packet[12:16]), DstIP: net.IP(packet[16:20]), FragOffset: uint16(offset / 8),
		}
		if more {
			ip.Flags = layers.IPv4MoreFragments
		}
		return MustSerialize(ip, gopacket.Payload(data))
	}
	ip := &layers.IPv6{
		Version: 6, HopLimit: packet[7], NextHeader: layers.IPProtocolIPv6Fragment,
		SrcIP: net.IP(packet[8:24]), DstIP: net.IP(packet[24:40]),
	}
	return MustSerialize(ip, &FragmentHeader{Next: layers.IPProtocol(packet[6]), Offset: offset, More: more, ID: id},
		gopacket.Payload(data))
}

// Split cuts the datagram packet into fragments of size bytes of its
// payload each (a multiple of 8), the last one carrying the rest, in
// order, all with identification id.
func Split(packet []byte, id uint32, size int) [][]byte {
	if size <= 0 || size%8 != 0 {
		panic(fmt.Sprintf("fragment size %d is not a positive multiple of 8", size))
	}
	payload := Payload(packet)
	var fragments [][]byte
	for off := 0; off < len(payload); off += size {
		end := min(off+size, len(payload))
		fragments = append(fragments, Fragment(packet, id, off, end < len(payload), payload[off:end]))
	}
	return fragments
}
