// SPDX-License-Identifier: Apache-2.0

package craft

import (
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testLink = Link{
	Src: net.HardwareAddr{2, 0, 0, 0, 0, 1},
	Dst: net.HardwareAddr{2, 0, 0, 0, 0, 2},
}

// The frames decode as what they claim to be, with gopacket's decoder: the
// tags in order, the chain of extension headers, the ports behind it.
func TestFramesDecode(t *testing.T) {
	marker := Marker("decode")
	packet := MustSerialize(
		&layers.IPv4{SrcIP: net.IPv4(10, 0, 0, 2), DstIP: net.IPv4(10, 99, 0, 1)},
		&layers.TCP{SrcPort: 40000, DstPort: 22, SYN: true, Window: 1024},
		gopacket.Payload(marker))
	frame := Ethernet(testLink, packet, Tag{TPID8021AD, 0}, Tag{TPID8021Q, 0}, Tag{TPID8021Q, 7})
	decoded := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	require.Nil(t, decoded.ErrorLayer())
	var tags int
	for _, l := range decoded.Layers() {
		if l.LayerType() == layers.LayerTypeDot1Q {
			tags++
		}
	}
	require.Equal(t, 3, tags)
	require.Equal(t, layers.EthernetType(TPID8021AD), decoded.Layer(layers.LayerTypeEthernet).(*layers.Ethernet).EthernetType)
	tcp := decoded.Layer(layers.LayerTypeTCP).(*layers.TCP)
	require.Equal(t, layers.TCPPort(22), tcp.DstPort)
	require.Equal(t, marker, []byte(decoded.ApplicationLayer().Payload()))

	packet6 := MustSerialize(
		&layers.IPv6{SrcIP: net.ParseIP("fd00::2"), DstIP: net.ParseIP("fd00:20::1")},
		&DestinationOptions{Count: 5},
		&layers.UDP{SrcPort: 40000, DstPort: 5353},
		gopacket.Payload(marker))
	require.Len(t, packet6, 40+5*8+8+len(marker))
	decoded = gopacket.NewPacket(Ethernet(testLink, packet6), layers.LayerTypeEthernet, gopacket.Default)
	require.Nil(t, decoded.ErrorLayer())
	require.Equal(t, layers.IPProtocolIPv6Destination, decoded.Layer(layers.LayerTypeIPv6).(*layers.IPv6).NextHeader)
	require.Equal(t, layers.UDPPort(5353), decoded.Layer(layers.LayerTypeUDP).(*layers.UDP).DstPort)

	quoted := Quote(packet, marker)
	require.Len(t, quoted, 20+8+len(marker))
	require.Equal(t, packet[:28], quoted[:28])
	require.Len(t, Quote(packet6, nil), 48)
}

// Fragments decode as fragments of their datagram, and their data put
// together at their offsets is the datagram's payload.
func TestFragments(t *testing.T) {
	marker := Marker("fragments")
	payload := append(make([]byte, 3000), marker...)
	for _, ip := range []gopacket.SerializableLayer{
		&layers.IPv4{SrcIP: net.IPv4(10, 0, 0, 2), DstIP: net.IPv4(10, 20, 0, 1)},
		&layers.IPv6{SrcIP: net.ParseIP("fd00::2"), DstIP: net.ParseIP("fd00:20::1")},
	} {
		packet := MustSerialize(ip, &layers.UDP{SrcPort: 40000, DstPort: 7300}, gopacket.Payload(payload))
		fragments := Split(packet, 0x12345, 1400)
		require.Len(t, fragments, 3)
		var whole []byte
		for i, f := range fragments {
			var offset int
			var more bool
			var data []byte
			if f[0]>>4 == 4 {
				d := gopacket.NewPacket(f, layers.LayerTypeIPv4, gopacket.Default)
				v4 := d.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				require.EqualValues(t, 0x2345, v4.Id)
				require.Equal(t, int(v4.Length), len(f))
				offset, more, data = int(v4.FragOffset)*8, v4.Flags&layers.IPv4MoreFragments != 0, v4.Payload
			} else {
				d := gopacket.NewPacket(f, layers.LayerTypeIPv6, gopacket.Default)
				v6 := d.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				require.Equal(t, layers.IPProtocolIPv6Fragment, v6.NextHeader)
				require.Equal(t, int(v6.Length)+40, len(f))
				fh := d.Layer(layers.LayerTypeIPv6Fragment).(*layers.IPv6Fragment)
				require.Equal(t, layers.IPProtocolUDP, fh.NextHeader)
				require.EqualValues(t, 0x12345, fh.Identification)
				offset, more, data = int(fh.FragmentOffset)*8, fh.MoreFragments, f[48:]
			}
			require.Equal(t, len(whole), offset, "fragment %d", i)
			require.Equal(t, i < len(fragments)-1, more, "fragment %d", i)
			whole = append(whole, data...)
		}
		require.Equal(t, Payload(packet), whole)
	}
}
