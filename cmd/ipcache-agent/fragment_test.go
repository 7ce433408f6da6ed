// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/craft"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// Fragmented datagrams of allowed UDP flows: before,
// the program matched every fragment after the first with no port, so a
// rule with ports passed a datagram's first fragment and dropped the rest,
// and a 3 KB datagram to an allowed UDP port never arrived. Now the first
// fragment is decided by policy and the rest of its datagram follows it,
// in order. Through the real agent binary on the bypass rig's network
// (bypass_test.go): real UDP sockets, whose datagrams the kernel
// fragments at the veths' MTU of 1500, and crafted fragments that overlap,
// leave a gap, come out of order or without their first fragment.

// fragmentPolicy allows UDP fragAllowed between the endpoint and the
// peer's allowed networks, both ways; everything else is default deny.
const fragmentPolicy = `name: fragments
egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 7300, protocol: UDP}]
ingress:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 7300, protocol: UDP}]
`

const (
	fragAllowed = 7300
	fragDenied  = 7301 // no rule: no-policy
	// fragRounds datagrams of each size, so that one lucky pass does
	// not count.
	fragRounds = 20
)

// fragSizes are the datagram sizes sent (UDP data): three fragments, and
// about forty, at MTU 1500.
var fragSizes = []int{3000, 60000}

// fragmentsOf is how many fragments the kernel makes of a UDP datagram of
// size bytes of data at MTU 1500: the UDP header and the data, in pieces
// of 1480 bytes behind an IPv4 header, 1448 behind IPv6's and its fragment
// header.
func fragmentsOf(ipv4 bool, size int) int {
	piece := 1448
	if ipv4 {
		piece = 1480
	}
	return (size + 8 + piece - 1) / piece
}

// TestPrivilegedFragments: see the top of this file.
func TestPrivilegedFragments(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	t.Run("UDP sockets", b.fragmentedSockets)
	t.Run("crafted fragments", b.craftedFragments)
}

// udpSocket is a UDP socket bound to addr in the network namespace ns,
// closed when the test ends.
func udpSocket(t *testing.T, ns, addr string) net.PacketConn {
	t.Helper()
	var c net.PacketConn
	require.NoError(t, netnstest.InNetns(t, ns, func() (err error) { c, err = net.ListenPacket("udp", addr); return err }),
		"UDP socket on %s in %s", addr, ns)
	t.Cleanup(func() { c.Close() })
	return c
}

// fragData is a datagram's data: size bytes that tell the round and the
// size, so that a datagram of another round cannot pass for this one.
func fragData(name string, round, size int) []byte {
	data := make([]byte, size)
	head := fmt.Appendf(nil, "%s round %d size %d pid %d;", name, round, size, os.Getpid())
	for i := range data {
		data[i] = head[i%len(head)]
	}
	return data
}

// fragmentedSockets: datagrams of 3 KB and 60 KB between real UDP sockets
// of the endpoint and the peer, both ways, under policies that allow one
// UDP port each way: every one to the allowed port arrives whole, none to
// another port arrives, and each fragment of those is counted as dropped.
func (b *bypassRig) fragmentedSockets(t *testing.T) {
	b.on(t)
	b.usePolicies(map[string]string{"fragments.yaml": fragmentPolicy})
	for _, f := range b.families() {
		ipv4 := f.name == "IPv4"
		for _, d := range []struct {
			direction          string
			senderNS, senderIP string
			receiverNS, to     string
		}{
			// To the peer: the endpoint's egress, from its TCX ingress.
			{"egress", b.epNS, f.ep, b.peerNS, f.allowed},
			// From the peer, routed by the host to the endpoint: its
			// ingress, at the host side's TCX egress.
			{"ingress", b.peerNS, f.allowed, b.epNS, f.ep},
		} {
			name := f.name + " " + d.direction
			t.Run(name, func(t *testing.T) {
				b.on(t)
				sender := udpSocket(t, d.senderNS, net.JoinHostPort(d.senderIP, "0"))
				allowed := udpSocket(t, d.receiverNS, net.JoinHostPort(d.to, strconv.Itoa(fragAllowed)))
				denied := udpSocket(t, d.receiverNS, net.JoinHostPort(d.to, strconv.Itoa(fragDenied)))
				allowedAddr, deniedAddr := allowed.LocalAddr(), denied.LocalAddr()
				buf := make([]byte, 65536)

				unplaced := b.drops(d.direction, "unplaced-fragment")
				for round := range fragRounds {
					for _, size := range fragSizes {
						data := fragData(name, round, size)
						_, err := sender.WriteTo(data, allowedAddr)
						require.NoError(t, err)
						allowed.SetReadDeadline(time.Now().Add(deliveredWithin))
						n, _, err := allowed.ReadFrom(buf)
						require.NoError(t, err, "round %d: the datagram of %d bytes to the allowed port did not arrive", round, size)
						require.Equal(t, size, n, "round %d: the datagram's length", round)
						require.Equal(t, data, buf[:n], "round %d: the datagram of %d bytes arrived other than sent", round, size)
					}
				}
				assert.Equal(t, unplaced, b.drops(d.direction, "unplaced-fragment"),
					"fragments of the allowed datagrams dropped as unplaced")

				// To the denied port: nothing arrives. The first fragment
				// of each is dropped by policy, the rest as fragments of
				// no datagram that passed.
				const deniedRounds = 3
				var want fragmentDrops
				for range deniedRounds {
					for _, size := range fragSizes {
						want.noPolicy++
						want.unplaced += uint64(fragmentsOf(ipv4, size) - 1)
					}
				}
				b.assertDroppedAlone(t, d.direction, want, func(attempt int) {
					for round := range deniedRounds {
						for _, size := range fragSizes {
							_, err := sender.WriteTo(fragData(fmt.Sprintf("%s denied %d", name, attempt), round, size), deniedAddr)
							require.NoError(t, err)
						}
					}
					denied.SetReadDeadline(time.Now().Add(notDeliveredWithin))
					n, _, err := denied.ReadFrom(buf)
					var ne net.Error
					require.True(t, errors.As(err, &ne) && ne.Timeout(), "attempt %d: the denied port read %d bytes (%v)", attempt, n, err)
				})
			})
		}
	}
}

// fragmentDrops is what a window of a direction's counters dropped as
// no-policy and as unplaced-fragment.
type fragmentDrops struct{ noPolicy, unplaced uint64 }

// assertDroppedAlone runs send, which sends what must not be delivered
// (and fails the test itself if it is), until one window of the
// direction's counters holds exactly want, three windows at most. The
// counters are the direction's: a packet of the namespaces' own (an IPv6
// multicast listener report, 110 bytes) dropped in the same window adds
// to them.
func (b *bypassRig) assertDroppedAlone(t *testing.T, direction string, want fragmentDrops, send func(attempt int)) {
	t.Helper()
	count := func() fragmentDrops {
		return fragmentDrops{b.drops(direction, "no-policy"), b.drops(direction, "unplaced-fragment")}
	}
	var got fragmentDrops
	for attempt := range 3 {
		before := count()
		send(attempt)
		after := count()
		got = fragmentDrops{after.noPolicy - before.noPolicy, after.unplaced - before.unplaced}
		if got == want {
			return
		}
	}
	assert.Equal(t, want.noPolicy, got.noPolicy, "fragments dropped as no-policy")
	assert.Equal(t, want.unplaced, got.unplaced, "fragments dropped as unplaced-fragment")
	t.Logf("datapath/counters:\n%s", b.shell("datapath/counters"))
}

// sendFragments sends each fragment from s. A fragment the transmit
// path's TCX program drops (sent from the host side to the endpoint) is
// no error: the counters say why.
func sendFragments(s *craft.Sender, fragments ...[]byte) error {
	for _, f := range fragments {
		if err := s.SendIP(f); err != nil && !errors.Is(err, craft.ErrDroppedOnTransmit) {
			return err
		}
	}
	return nil
}

// fragAttack is a sequence of crafted fragments of datagrams to the
// allowed port; build makes it from the datagram (carrying the marker)
// and its identification.
type fragAttack struct {
	name string
	// build returns the fragments to send, in order.
	build func(datagram []byte, id uint32) [][]byte
	// noPolicy and unplaced are the drops it must be counted with.
	noPolicy, unplaced uint64
	// deliveredWithoutPolicy: with no policy in force, this kernel puts
	// the datagram together (out of order, say): the drop is the
	// program's.
	deliveredWithoutPolicy bool
}

// fragAttacks cut a 3 KB datagram (4 fragments of 1000 bytes, the last 8)
// in ways the program must not pass.
func fragAttacks(deniedFirst func(id uint32) []byte) []fragAttack {
	split := func(d []byte, id uint32) [][]byte { return craft.Split(d, id, 1000) }
	return []fragAttack{{
		name:  "later fragments without a first one",
		build: func(d []byte, id uint32) [][]byte { return split(d, id)[1:] },
		// All 3 are placed nowhere.
		unplaced: 3,
	}, {
		name: "a fragment overlapping the first",
		build: func(d []byte, id uint32) [][]byte {
			s := split(d, id)
			overlap := craft.Fragment(d, id, 992, true, make([]byte, 1000))
			return [][]byte{s[0], overlap, s[1], s[2], s[3]}
		},
		unplaced: 4,
	}, {
		name: "a fragment at offset 8 over a first fragment of 16 bytes",
		build: func(d []byte, id uint32) [][]byte {
			p := craft.Payload(d)
			fragments := [][]byte{craft.Fragment(d, id, 0, true, p[:16]), craft.Fragment(d, id, 8, true, make([]byte, 16))}
			for off := 16; off < len(p); off += 1000 {
				end := min(off+1000, len(p))
				fragments = append(fragments, craft.Fragment(d, id, off, end < len(p), p[off:end]))
			}
			return fragments
		},
		// The overlap, then the rest (3 fragments from offset 16).
		unplaced: 4,
	}, {
		name: "the first fragment again, its UDP header rewritten to a denied port",
		build: func(d []byte, id uint32) [][]byte {
			s := split(d, id)
			return [][]byte{s[0], deniedFirst(id), s[1], s[2], s[3]}
		},
		noPolicy: 1, unplaced: 3,
	}, {
		name: "a gap",
		build: func(d []byte, id uint32) [][]byte {
			s := split(d, id)
			return [][]byte{s[0], s[2], s[3]}
		},
		unplaced: 2,
	}, {
		// Documented fail-closed: fragments are placed in order only.
		name: "out of order",
		build: func(d []byte, id uint32) [][]byte {
			s := split(d, id)
			return [][]byte{s[0], s[1], s[3], s[2]}
		},
		unplaced: 2, deliveredWithoutPolicy: true,
	}, {
		name: "last fragment first",
		build: func(d []byte, id uint32) [][]byte {
			s := split(d, id)
			return [][]byte{s[3], s[0], s[1], s[2]}
		},
		unplaced: 1, deliveredWithoutPolicy: true,
	}}
}

// craftedFragments: crafted fragments of datagrams to the allowed port,
// both ways. In order they arrive; cut in the ways of fragAttacks, they
// do not, and each fragment the program could not place is counted as
// unplaced-fragment.
func (b *bypassRig) craftedFragments(t *testing.T) {
	b.on(t)
	var id uint32 = uint32(os.Getpid()) << 8
	for _, policies := range []map[string]string{nil, {"fragments.yaml": fragmentPolicy}} {
		b.usePolicies(policies)
		enforced := policies != nil
		for _, f := range b.families() {
			for _, d := range []struct {
				direction string
				from      *craft.Sender
				at        *craft.Listener
				src, dst  string
			}{
				{"egress", b.fromEP, f.udpAtPeer, f.ep, f.allowed},
				// From the host side to the endpoint, through its TCX
				// egress: the host does not put them together first.
				{"ingress", b.fromHost, f.udpAtEP, f.allowed, f.ep},
			} {
				name := fmt.Sprintf("%s %s", f.name, d.direction)
				if !enforced {
					name += " (no policy)"
				}
				datagram := func(m []byte, port uint16) []byte {
					data := append(append([]byte{}, m...), make([]byte, 3000-len(m))...)
					return udp(d.src, d.dst, 41000, port, data)
				}
				b.requireDelivered(t, name+" in order", d.at, func(m []byte) error {
					id++
					return sendFragments(d.from, craft.Split(datagram(m, fragAllowed), id, 1000)...)
				})
				b.requireDelivered(t, name+" 60 KB in order", d.at, func(m []byte) error {
					id++
					data := append(append([]byte{}, m...), make([]byte, 60000)...)
					return sendFragments(d.from, craft.Split(udp(d.src, d.dst, 41000, fragAllowed, data), id, 1448)...)
				})
				deniedFirst := func(id uint32) []byte {
					return craft.Split(datagram(nil, fragDenied), id, 1000)[0]
				}
				for _, a := range fragAttacks(deniedFirst) {
					send := func(m []byte) error {
						id++
						return sendFragments(d.from, a.build(datagram(m, fragAllowed), id)...)
					}
					if !enforced {
						if a.deliveredWithoutPolicy {
							b.requireDelivered(t, name+" "+a.name, d.at, send)
						}
						continue
					}
					t.Run(name+" "+a.name, func(t *testing.T) {
						b.on(t)
						b.assertDroppedAlone(t, d.direction, fragmentDrops{noPolicy: a.noPolicy, unplaced: a.unplaced}, func(attempt int) {
							marker := craft.Marker(fmt.Sprintf("%s %s %d", name, a.name, attempt))
							require.NoError(t, send(marker))
							require.False(t, d.at.WaitFor(marker, notDeliveredWithin), "the datagram got through")
						})
					})
				}
			}
		}
	}
}
