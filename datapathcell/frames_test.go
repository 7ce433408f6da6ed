// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"net/netip"
)

// Frame builders for the parser's tests (parse_rules_test.go) and the
// parser's fuzz target (fuzz_enforce_test.go): Ethernet frames with IPv4
// (options, fragments), IPv6 (extension header chains) and TCP, UDP, ICMP
// and ICMPv6 headers, built byte by byte, without checksums (the program
// reads none).

const (
	etherTypeIPv4   = 0x0800
	etherTypeIPv6   = 0x86DD
	etherTypeARP    = 0x0806
	etherType8021Q  = 0x8100
	etherType8021AD = 0x88A8

	protoHopOpts  = 0
	protoRouting  = 43
	protoFragment = 44
	protoESP      = 50
	protoAH       = 51
	protoICMPv6   = 58
	protoNoNext   = 59
	protoDstOpts  = 60
)

// ethFrame is an Ethernet header of ethertype (made-up MACs) followed by
// payload.
func ethFrame(ethertype uint16, payload []byte) []byte {
	p := make([]byte, 14, 14+len(payload))
	copy(p[0:6], []byte{0x02, 0, 0, 0, 0, 0x01})
	copy(p[6:12], []byte{0x02, 0, 0, 0, 0, 0x02})
	binary.BigEndian.PutUint16(p[12:14], ethertype)
	return append(p, payload...)
}

// vlanFrame is frame (an Ethernet frame) with an in-band tag of tpid
// (802.1Q or 802.1ad) and VLAN id vid inserted after the MACs.
func vlanFrame(tpid, vid uint16, frame []byte) []byte {
	p := make([]byte, 0, len(frame)+4)
	p = append(p, frame[:12]...)
	p = binary.BigEndian.AppendUint16(p, tpid)
	p = binary.BigEndian.AppendUint16(p, vid)
	return append(p, frame[12:]...)
}

// ipv4Header is an IPv4 header from src to dst of protocol with options
// (a multiple of 4 bytes), the fragment field frag (flags and offset in
// 8-byte units) and identification id, for a payload of payloadLen bytes.
func ipv4Header(src, dst netip.Addr, protocol uint8, options []byte, frag, id uint16, payloadLen int) []byte {
	hlen := 20 + len(options)
	ip := make([]byte, hlen)
	ip[0] = 0x40 | uint8(hlen/4)
	binary.BigEndian.PutUint16(ip[2:4], uint16(hlen+payloadLen))
	binary.BigEndian.PutUint16(ip[4:6], id)
	binary.BigEndian.PutUint16(ip[6:8], frag)
	ip[8] = 64
	ip[9] = protocol
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	copy(ip[20:], options)
	return ip
}

// frame4 is an Ethernet frame of an IPv4 packet without options, not a
// fragment.
func frame4(src, dst netip.Addr, protocol uint8, l4 []byte) []byte {
	return frame4x(src, dst, protocol, nil, 0, 0, l4)
}

// frame4x is frame4 with options and the fragment field and id.
func frame4x(src, dst netip.Addr, protocol uint8, options []byte, frag, id uint16, l4 []byte) []byte {
	ip := ipv4Header(src, dst, protocol, options, frag, id, len(l4))
	return ethFrame(etherTypeIPv4, append(ip, l4...))
}

// ext6 is an IPv6 extension header of type kind with body after its next
// header and length bytes: for hop-by-hop, routing and destination
// options 6 + 8n bytes, for AH 2 + 4n (n >= 1), for the fragment header
// 6 (use fragHeader).
type ext6 struct {
	kind uint8
	body []byte
}

// padExt is a hop-by-hop, routing or destination options header of 8
// bytes: a PadN option (routing: type 0, segments left 0, reserved).
func padExt(kind uint8) ext6 {
	return ext6{kind: kind, body: []byte{1, 4, 0, 0, 0, 0}}
}

// ahExt is an authentication header of 12 bytes (SPI, sequence, no ICV).
func ahExt() ext6 {
	return ext6{kind: protoAH, body: []byte{0, 0, 0, 0, 0, 1, 0, 0, 0, 1}}
}

// fragExt is a fragment header: offset in bytes (a multiple of 8), the M
// flag, identification id.
func fragExt(offset uint16, more bool, id uint32) ext6 {
	b := make([]byte, 6)
	v := offset & 0xfff8
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(b[0:2], v)
	binary.BigEndian.PutUint32(b[2:6], id)
	return ext6{kind: protoFragment, body: b}
}

// frame6 is an Ethernet frame of an IPv6 packet from src to dst with hop
// limit 64, the extension headers exts in order, then protocol and l4.
func frame6(src, dst netip.Addr, exts []ext6, protocol uint8, l4 []byte) []byte {
	return frame6h(src, dst, 64, exts, protocol, l4)
}

// frame6h is frame6 with the hop limit hops.
func frame6h(src, dst netip.Addr, hops uint8, exts []ext6, protocol uint8, l4 []byte) []byte {
	var payload []byte
	for i, e := range exts {
		next := protocol
		if i+1 < len(exts) {
			next = exts[i+1].kind
		}
		n := 2 + len(e.body)
		var length uint8
		switch e.kind {
		case protoAH:
			length = uint8(n/4 - 2)
		case protoFragment:
			length = 0
		default:
			length = uint8(n/8 - 1)
		}
		payload = append(payload, next, length)
		payload = append(payload, e.body...)
	}
	payload = append(payload, l4...)
	ip := make([]byte, 40, 40+len(payload))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(payload)))
	ip[6] = protocol
	if len(exts) > 0 {
		ip[6] = exts[0].kind
	}
	ip[7] = hops
	s, d := src.As16(), dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	return ethFrame(etherTypeIPv6, append(ip, payload...))
}

// tcpHeader is a TCP header of 20 bytes with flags.
func tcpHeader(sport, dport uint16, flags uint8) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:2], sport)
	binary.BigEndian.PutUint16(h[2:4], dport)
	h[12] = 0x50
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:16], 65535)
	return h
}

// udpHeader is a UDP header of 8 bytes and payload.
func udpHeader(sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(h[0:2], sport)
	binary.BigEndian.PutUint16(h[2:4], dport)
	binary.BigEndian.PutUint16(h[4:6], uint16(8+len(payload)))
	return append(h, payload...)
}

// icmpHeader is an ICMP or ICMPv6 header of 8 bytes: type, code, and for
// echo the identifier id (sequence 1), followed by rest (an error's
// quoted packet).
func icmpHeader(typ, code uint8, id uint16, rest []byte) []byte {
	h := make([]byte, 8, 8+len(rest))
	h[0], h[1] = typ, code
	binary.BigEndian.PutUint16(h[4:6], id)
	binary.BigEndian.PutUint16(h[6:8], 1)
	return append(h, rest...)
}

// quote is what an ICMP error quotes of frame (an Ethernet frame): its IP
// header and the first 8 bytes after it.
func quote(frame []byte) []byte {
	ip := frame[14:]
	n := 40
	if ip[0]>>4 == 4 {
		n = int(ip[0]&0x0f) * 4
	}
	n += 8
	if n > len(ip) {
		n = len(ip)
	}
	return append([]byte(nil), ip[:n]...)
}
