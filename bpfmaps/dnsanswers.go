// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// The dns-answers ring buffer: DNS answers over UDP that reached a local
// endpoint without passing through the DNS proxy while one was configured
// (the agent down or restarting), which the program records so that the
// agent learns the addresses answered (datapathcell/bpf/enforce.c, "DNS
// answers that bypass the proxy"). Each record is one fixed-size struct
// dns_answer:
//
//	0    family u8 (1 IPv4, 2 IPv6) | pad [3]u8
//	4    length u32 (host order): the UDP payload's length
//	8    ifindex u32 (host order): the device it was received on
//	12   pad u32
//	16   endpoint [16]u8: the destination (IPv4 in the first 4 bytes)
//	32   server [16]u8: the source
//	48   payload [DNSAnswerPayloadMax]u8: the first min(length,
//	     DNSAnswerPayloadMax) bytes of the UDP payload (the DNS message)
//
// Pinned, so that records written while no agent reads stay there for the
// next one, with the ring's consumer position.
const (
	// DNSAnswerPayloadMax is the most of an answer a record keeps:
	// EDNS's safe UDP size. A longer answer keeps its first bytes and its
	// length.
	DNSAnswerPayloadMax = 1232
	// DNSAnswerRecordSize is the size of a record.
	DNSAnswerRecordSize = 48 + DNSAnswerPayloadMax
	// DNSAnswersRingBytes is the size of the ring buffer's data area
	// (4 MiB: a few thousand records).
	DNSAnswersRingBytes = 4 << 20
)

// DNSAnswerRecord is a decoded record of the dns-answers ring.
type DNSAnswerRecord struct {
	// Family is 1 for IPv4, 2 for IPv6 (Endpoint and Server say it too).
	Family uint8
	// Endpoint is the local endpoint that received the answer, Server
	// the address it came from (port 53).
	Endpoint, Server netip.Addr
	// Ifindex is the device the program saw the answer on.
	Ifindex uint32
	// Length is the UDP payload's length; Payload holds its first
	// min(Length, DNSAnswerPayloadMax) bytes.
	Length  uint32
	Payload []byte
}

// Truncated reports whether the record holds only the first bytes of the
// answer.
func (r DNSAnswerRecord) Truncated() bool { return int(r.Length) > len(r.Payload) }

// DecodeDNSAnswer decodes a record of the dns-answers ring (as
// ringbuf.Record.RawSample holds it). Payload is a copy.
//
// Possible errors: ErrBadDNSAnswer (wrapped) when raw is shorter than a
// record or its family is neither IPv4 nor IPv6.
func DecodeDNSAnswer(raw []byte) (DNSAnswerRecord, error) {
	if len(raw) < DNSAnswerRecordSize {
		return DNSAnswerRecord{}, fmt.Errorf("%w: %d bytes, want %d", ErrBadDNSAnswer, len(raw), DNSAnswerRecordSize)
	}
	r := DNSAnswerRecord{
		Family:  raw[0],
		Length:  binary.NativeEndian.Uint32(raw[4:8]),
		Ifindex: binary.NativeEndian.Uint32(raw[8:12]),
	}
	switch r.Family {
	case familyIPv4:
		r.Endpoint = netip.AddrFrom4([4]byte(raw[16:20]))
		r.Server = netip.AddrFrom4([4]byte(raw[32:36]))
	case familyIPv6:
		r.Endpoint = netip.AddrFrom16([16]byte(raw[16:32]))
		r.Server = netip.AddrFrom16([16]byte(raw[32:48]))
	default:
		return DNSAnswerRecord{}, fmt.Errorf("%w: family %d", ErrBadDNSAnswer, r.Family)
	}
	n := min(int(r.Length), DNSAnswerPayloadMax)
	r.Payload = append([]byte(nil), raw[48:48+n]...)
	return r, nil
}

// DNSAnswersSpec: the ring buffer of DNS answers that bypassed the proxy.
func DNSAnswersSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       DNSAnswersName,
		Type:       ebpf.RingBuf,
		MaxEntries: DNSAnswersRingBytes,
	}
}

// DNSAnswersLostSpec: per CPU, one u64, the records the full dns-answers
// ring could not take.
func DNSAnswersLostSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       DNSAnswersLostName,
		Type:       ebpf.PerCPUArray,
		KeySize:    4,
		ValueSize:  8,
		MaxEntries: 1,
	}
}

// ReadDNSAnswersLost sums the dns-answers-lost map over the CPUs.
//
// Possible errors: the map cannot be read.
func ReadDNSAnswersLost(m *ebpf.Map) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read %s: %w", DNSAnswersLostName, err)
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum, nil
}
