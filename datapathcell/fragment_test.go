// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/craft"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Fragmented datagrams: the first fragment is decided
// by policy; when it passes, the rest of its datagram passes in order,
// each fragment starting where the one before ended. Anything else after
// the first (no first fragment seen, an overlap, a gap, out of order, a
// fragment after the last) is dropped as unplaced-fragment and drops the
// rest of the datagram. Run with BPF_PROG_RUN on crafted fragments, in
// both directions and both families.

const (
	fragAllowedPort  = 7300 // UDP: the peer's at egress, the endpoint's at ingress
	fragDeniedPort   = 7301 // no rule: default deny
	fragEndpointPort = 40000
	fragPeerPort     = 41000
)

var (
	fragEndpoint6 = netip.MustParseAddr("fd00:201::2")
	fragPeer6     = netip.MustParseAddr("fd00:20::1")
	fragLink      = craft.Link{Src: net.HardwareAddr{2, 0, 0, 0, 0, 1}, Dst: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
)

// fragRig is the program with egress and ingress enforced: the peer
// (identity testIdentityAllowed, IPv4 and IPv6) may receive UDP on
// fragAllowedPort and send to the endpoint's fragAllowedPort.
type fragRig struct {
	t    *testing.T
	maps enforcerMaps
	enf  *enforcer
	ids  uint32
}

func newFragRig(t *testing.T) *fragRig {
	privileged.Test(t)
	maps := newTestEnforcerMaps(t)
	r := &fragRig{t: t, maps: maps, enf: loadTestEnforcer(t, maps), ids: 0x1000}
	putIdentity(t, maps, netip.PrefixFrom(benchPeer, 32).String(), testIdentityAllowed)
	putIdentity(t, maps, netip.PrefixFrom(fragPeer6, 128).String(), testIdentityAllowed)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoUDP, fragAllowedPort)
	putAllow(t, maps, testIdentityAllowed, policy.Ingress, testProtoUDP, fragAllowedPort)
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	return r
}

// id is a datagram identification no other datagram of the test has.
func (r *fragRig) id() uint32 { r.ids++; return r.ids }

// path is one direction of one family: what the endpoint and the peer
// send there.
type fragPath struct {
	name      string
	direction policy.Direction
	endpoint  netip.Addr
	peer      netip.Addr
}

func fragPaths() []fragPath {
	var paths []fragPath
	for _, fam := range []struct {
		name           string
		endpoint, peer netip.Addr
	}{{"IPv4", benchEndpoint, benchPeer}, {"IPv6", fragEndpoint6, fragPeer6}} {
		paths = append(paths,
			fragPath{fam.name + " egress", policy.Egress, fam.endpoint, fam.peer},
			fragPath{fam.name + " ingress", policy.Ingress, fam.endpoint, fam.peer})
	}
	return paths
}

// datagram is a UDP datagram of size bytes of data on the path to the
// allowed side's port (the peer's fragAllowedPort at egress, the
// endpoint's at ingress) or to port, when port is not 0.
func (p fragPath) datagram(size int, port uint16) []byte {
	if port == 0 {
		port = fragAllowedPort
	}
	src, dst := netip.AddrPortFrom(p.endpoint, fragEndpointPort), netip.AddrPortFrom(p.peer, port)
	if p.direction == policy.Ingress {
		src, dst = netip.AddrPortFrom(p.peer, fragPeerPort), netip.AddrPortFrom(p.endpoint, port)
	}
	return udpDatagram(src, dst, size)
}

// reply is a datagram from the peer's fragAllowedPort to the endpoint's
// fragEndpointPort: the replies of the endpoint's flow to the peer.
func (p fragPath) reply(size int) []byte {
	return udpDatagram(netip.AddrPortFrom(p.peer, fragAllowedPort), netip.AddrPortFrom(p.endpoint, fragEndpointPort), size)
}

func udpDatagram(src, dst netip.AddrPort, size int) []byte {
	var ip gopacket.SerializableLayer = &layers.IPv4{SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	if src.Addr().Is6() {
		ip = &layers.IPv6{SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i)
	}
	return craft.MustSerialize(ip, &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())},
		gopacket.Payload(data))
}

// run runs the program of direction on the IP packet in an Ethernet frame.
func (r *fragRig) run(direction policy.Direction, packet []byte) uint32 {
	r.t.Helper()
	prog := r.enf.fromEndpoint
	if direction == policy.Ingress {
		prog = r.enf.toEndpoint
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: craft.Ethernet(fragLink, packet)})
	require.NoError(r.t, err)
	return ret
}

// fragCounts is what the counters say of one direction.
type fragCounts struct {
	allowed, unplaced, noPolicy, extHeaders uint64
}

func (r *fragRig) counts(direction policy.Direction) fragCounts {
	r.t.Helper()
	c := readTestCounters(r.t, r.maps)
	n := fragCounts{allowed: c.IngressAllowed}
	if direction == policy.Egress {
		n.allowed = c.EgressAllowed
	}
	for _, d := range c.Drops {
		if d.Direction != direction {
			continue
		}
		switch d.Reason {
		case bpfmaps.ReasonFragment:
			n.unplaced = d.Packets
		case bpfmaps.ReasonNoPolicy:
			n.noPolicy = d.Packets
		case bpfmaps.ReasonExtHeaders:
			n.extHeaders = d.Packets
		}
	}
	return n
}

// expect runs the fragments in order on direction and requires each
// verdict (true: passed), then the counters to have moved by want.
func (r *fragRig) expect(direction policy.Direction, fragments [][]byte, passes []bool, want fragCounts) {
	r.t.Helper()
	require.Len(r.t, passes, len(fragments), "a verdict per fragment")
	before := r.counts(direction)
	for i, f := range fragments {
		want := uint32(tcxDropRet)
		if passes[i] {
			want = tcxNextRet
		}
		assert.Equal(r.t, want, r.run(direction, f), "fragment %d of %d (offset %d)", i, len(fragments), fragOffset(f))
	}
	after := r.counts(direction)
	got := fragCounts{after.allowed - before.allowed, after.unplaced - before.unplaced,
		after.noPolicy - before.noPolicy, after.extHeaders - before.extHeaders}
	assert.Equal(r.t, want, got, "counted (allowed, unplaced-fragment, no-policy, ext-headers)")
}

// fragOffset is a fragment's offset in bytes, for messages.
func fragOffset(f []byte) int {
	if f[0]>>4 == 4 {
		return int(uint16(f[6])<<8|uint16(f[7])) & 0x1fff * 8
	}
	return int(uint16(f[42])<<8|uint16(f[43])) &^ 7
}

// fragmentsMap is the program's (unpinned) fragments map.
func (r *fragRig) fragmentsMap() *ebpf.Map {
	r.t.Helper()
	info, err := r.enf.fromEndpoint.Info()
	require.NoError(r.t, err)
	ids, ok := info.MapIDs()
	require.True(r.t, ok, "the program's map ids")
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		require.NoError(r.t, err)
		mi, err := m.Info()
		require.NoError(r.t, err)
		if mi.Name == "fragments" {
			r.t.Cleanup(func() { m.Close() })
			return m
		}
		m.Close()
	}
	require.FailNow(r.t, "the program has no fragments map")
	return nil
}

// hasEntry says whether the fragments map holds a datagram of
// identification id (IPv4's low 16 bits). The key holds the packet's
// bytes of it: IPv4's two, then two zero bytes, or IPv6's four.
func (r *fragRig) hasEntry(id uint32) bool {
	r.t.Helper()
	var k, v []byte
	var found bool
	it := r.fragmentsMap().Iterate()
	for it.Next(&k, &v) {
		got := binary.BigEndian.Uint32(k[32:36])
		if (k[36] == 1 && got == id<<16&0xffff0000) || (k[36] == 2 && got == id) {
			found = true
		}
	}
	require.NoError(r.t, it.Err())
	return found
}

func verdicts(n int, v bool) []bool {
	s := make([]bool, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func TestPrivilegedFragments(t *testing.T) {
	t.Parallel()
	r := newFragRig(t)
	for _, p := range fragPaths() {
		d := p.direction
		t.Run(p.name, func(t *testing.T) {
			r.t = t
			defer func() { r.t = nil }()

			// 3 KB in 1000-byte pieces: four fragments.
			t.Run("in order, then a fragment after the last", func(t *testing.T) {
				r.t = t
				for round := range 20 {
					id := r.id()
					fragments := craft.Split(p.datagram(3000, 0), id, 1000)
					require.Len(t, fragments, 4)
					r.expect(d, fragments[:3], verdicts(3, true), fragCounts{allowed: 3})
					require.True(t, r.hasEntry(id), "round %d: the datagram's entry while it lasts", round)
					r.expect(d, fragments[3:], verdicts(1, true), fragCounts{allowed: 1})
					require.False(t, r.hasEntry(id), "round %d: the last fragment ended the datagram's entry", round)
					// The datagram is over: its fragments, again, are
					// placed nowhere.
					r.expect(d, fragments[3:], []bool{false}, fragCounts{unplaced: 1})
					r.expect(d, fragments[1:2], []bool{false}, fragCounts{unplaced: 1})
				}
			})
			t.Run("60 KB in order", func(t *testing.T) {
				r.t = t
				id := r.id()
				fragments := craft.Split(p.datagram(60000, 0), id, 1448)
				r.expect(d, fragments, verdicts(len(fragments), true), fragCounts{allowed: uint64(len(fragments))})
				require.False(t, r.hasEntry(id))
			})
			t.Run("no first fragment", func(t *testing.T) {
				r.t = t
				id := r.id()
				fragments := craft.Split(p.datagram(3000, 0), id, 1000)
				r.expect(d, fragments[1:], verdicts(3, false), fragCounts{unplaced: 3})
				require.False(t, r.hasEntry(id))
			})
			t.Run("first fragment denied", func(t *testing.T) {
				r.t = t
				id := r.id()
				fragments := craft.Split(p.datagram(3000, fragDeniedPort), id, 1000)
				r.expect(d, fragments, verdicts(4, false), fragCounts{noPolicy: 1, unplaced: 3})
				require.False(t, r.hasEntry(id))
			})
			t.Run("overlap: the rest of the datagram dropped", func(t *testing.T) {
				r.t = t
				packet := p.datagram(3000, 0)
				id := r.id()
				fragments := craft.Split(packet, id, 1000)
				overlap := craft.Fragment(packet, id, 992, true, make([]byte, 1000))
				r.expect(d, [][]byte{fragments[0], overlap, fragments[1], fragments[2], fragments[3]},
					[]bool{true, false, false, false, false}, fragCounts{allowed: 1, unplaced: 4})
				require.False(t, r.hasEntry(id), "the overlap ended the datagram's entry")
			})
			t.Run("overlap of the transport header", func(t *testing.T) {
				// A later fragment at offset 8 over a first fragment of 16
				// bytes: where the first's data, right behind the UDP
				// header, would be rewritten.
				r.t = t
				packet := p.datagram(3000, 0)
				id := r.id()
				payload := craft.Payload(packet)
				first := craft.Fragment(packet, id, 0, true, payload[:16])
				over := craft.Fragment(packet, id, 8, true, make([]byte, 16))
				rest := craft.Fragment(packet, id, 16, false, payload[16:])
				r.expect(d, [][]byte{first, over, rest}, []bool{true, false, false}, fragCounts{allowed: 1, unplaced: 2})
			})
			t.Run("the first fragment again, to a denied port", func(t *testing.T) {
				// Offset 0 is a first fragment, decided by policy on its
				// own ports: one that rewrites the UDP header to a denied
				// port is dropped and ends the datagram.
				r.t = t
				packet := p.datagram(3000, 0)
				id := r.id()
				fragments := craft.Split(packet, id, 1000)
				rewritten := craft.Split(p.datagram(3000, fragDeniedPort), id, 1000)[0]
				r.expect(d, [][]byte{fragments[0], rewritten, fragments[1], fragments[2], fragments[3]},
					[]bool{true, false, false, false, false}, fragCounts{allowed: 1, noPolicy: 1, unplaced: 3})
				require.False(t, r.hasEntry(id))
			})
			t.Run("first fragment too short for the ports", func(t *testing.T) {
				// No port: policy has no rule for all of UDP.
				r.t = t
				packet := p.datagram(3000, 0)
				id := r.id()
				payload := craft.Payload(packet)
				r.expect(d, [][]byte{craft.Fragment(packet, id, 0, true, nil), craft.Fragment(packet, id, 0, true, payload[:8]),
					craft.Fragment(packet, id, 8, false, payload[8:])},
					[]bool{false, true, true}, fragCounts{noPolicy: 1, allowed: 2})
			})
			t.Run("gap", func(t *testing.T) {
				r.t = t
				fragments := craft.Split(p.datagram(3000, 0), r.id(), 1000)
				r.expect(d, [][]byte{fragments[0], fragments[2], fragments[1], fragments[3]},
					[]bool{true, false, false, false}, fragCounts{allowed: 1, unplaced: 3})
			})
			t.Run("out of order: fail-closed", func(t *testing.T) {
				// The program places fragments in order only: a datagram
				// whose fragments arrive out of order is dropped, though
				// the receiver would put it together.
				r.t = t
				fragments := craft.Split(p.datagram(3000, 0), r.id(), 1000)
				r.expect(d, [][]byte{fragments[0], fragments[1], fragments[3], fragments[2]},
					[]bool{true, true, false, false}, fragCounts{allowed: 2, unplaced: 2})
				fragments = craft.Split(p.datagram(3000, 0), r.id(), 1000)
				r.expect(d, [][]byte{fragments[3], fragments[2], fragments[1], fragments[0]},
					[]bool{false, false, false, true}, fragCounts{allowed: 1, unplaced: 3})
			})
			t.Run("an entry is the direction's", func(t *testing.T) {
				// The same addresses and identification the other way:
				// the fragment is placed nowhere there.
				r.t = t
				other := policy.Ingress
				if d == policy.Ingress {
					other = policy.Egress
				}
				packet := p.datagram(3000, 0)
				id := r.id()
				fragments := craft.Split(packet, id, 1000)
				r.expect(d, fragments[:1], []bool{true}, fragCounts{allowed: 1})
				reversed := fragPath{p.name, other, p.endpoint, p.peer}.datagram(3000, 0)
				r.expect(other, [][]byte{craft.Fragment(reversed, id, 1000, true, make([]byte, 1000))},
					[]bool{false}, fragCounts{unplaced: 1})
				r.expect(d, fragments[1:], verdicts(3, true), fragCounts{allowed: 3})
			})
			t.Run("identifications are datagrams of their own", func(t *testing.T) {
				// Two datagrams interleaved, one allowed, one denied.
				r.t = t
				ida, idb := r.id(), r.id()
				a := craft.Split(p.datagram(3000, 0), ida, 1000)
				b := craft.Split(p.datagram(3000, fragDeniedPort), idb, 1000)
				r.expect(d, [][]byte{a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3]},
					[]bool{true, false, true, false, true, false, true, false}, fragCounts{allowed: 4, noPolicy: 1, unplaced: 3})
				require.False(t, r.hasEntry(ida))
				require.False(t, r.hasEntry(idb))
			})
		})
	}
	r.t = t
	// The replies of an allowed flow pass as replies, fragmented too:
	// egress allows the endpoint's datagrams to the peer's port, and
	// nothing allows the peer's port to the endpoint's.
	for _, p := range fragPaths() {
		if p.direction != policy.Egress {
			continue
		}
		t.Run(p.name+" fragmented replies", func(t *testing.T) {
			r.t = t
			require.EqualValues(t, tcxNextRet, r.run(policy.Egress, p.datagram(100, 0)), "the flow")
			fragments := craft.Split(p.reply(3000), r.id(), 1000)
			r.expect(policy.Ingress, fragments, verdicts(4, true), fragCounts{allowed: 4})
		})
	}
}

// An IPv6 fragment after the first carries the datagram's data right
// after its fragment header, whatever the header says follows: it is not
// walked as headers. Nine destination options headers there would be a
// chain the program drops (ext-headers) in a first fragment or an
// unfragmented packet.
func TestPrivilegedIPv6LaterFragmentNotParsedAsHeaders(t *testing.T) {
	t.Parallel()
	r := newFragRig(t)
	p := fragPaths()[2] // IPv6 egress
	require.Equal(t, "IPv6 egress", p.name)
	src, dst := netip.AddrPortFrom(p.endpoint, fragEndpointPort), netip.AddrPortFrom(p.peer, fragAllowedPort)
	chain := craft.MustSerialize(&layers.IPv6{SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()},
		&craft.DestinationOptions{Count: 9}, &layers.UDP{SrcPort: fragEndpointPort, DstPort: fragAllowedPort},
		gopacket.Payload(make([]byte, 64)))
	r.expect(p.direction, [][]byte{chain}, []bool{false}, fragCounts{extHeaders: 1})

	// The first fragment: a plain UDP datagram's first 1000 bytes; the
	// second says next header 60 and carries bytes that read as nine
	// destination options headers.
	packet := p.datagram(3000, 0)
	id := r.id()
	payload := craft.Payload(packet)
	looksLikeHeaders := craft.Payload(chain)[:9*8]
	later := func(offset int, more bool, data []byte) []byte {
		f := craft.Fragment(packet, id, offset, more, data)
		f[40] = byte(layers.IPProtocolIPv6Destination) // the fragment header's next header
		return f
	}
	r.expect(p.direction, [][]byte{
		craft.Fragment(packet, id, 0, true, payload[:1000]),
		later(1000, true, append(append([]byte{}, looksLikeHeaders...), payload[1000+len(looksLikeHeaders):2000]...)),
		later(2000, false, payload[2000:]),
	}, verdicts(3, true), fragCounts{allowed: 3})

	// Without a first fragment it is placed nowhere: unplaced, not a
	// chain too long.
	r.expect(p.direction, [][]byte{later(1000, true, looksLikeHeaders)}, []bool{false}, fragCounts{unplaced: 1})

	// A first fragment's headers after the fragment header are walked:
	// two destination options headers, then UDP to the allowed port,
	// then its later fragments, at offsets that count those headers.
	withOptions := craft.MustSerialize(&layers.IPv6{SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()},
		&craft.DestinationOptions{Count: 2}, &layers.UDP{SrcPort: fragEndpointPort, DstPort: fragAllowedPort},
		gopacket.Payload(make([]byte, 3000)))
	fragments := craft.Split(withOptions, r.id(), 1000)
	r.expect(p.direction, fragments, verdicts(len(fragments), true), fragCounts{allowed: uint64(len(fragments))})
	denied := craft.MustSerialize(&layers.IPv6{SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()},
		&craft.DestinationOptions{Count: 2}, &layers.UDP{SrcPort: fragEndpointPort, DstPort: fragDeniedPort},
		gopacket.Payload(make([]byte, 3000)))
	id = r.id()
	fragments = craft.Split(denied, id, 1000)
	r.expect(p.direction, fragments, verdicts(len(fragments), false),
		fragCounts{noPolicy: 1, unplaced: uint64(len(fragments) - 1)})
	require.False(t, r.hasEntry(id))
}
