// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/craft"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// The known bypasses of enforcement, each sent as crafted frames through
// the real
// agent binary: in-band VLAN tags, ICMP errors that quote an allowed flow
// but go elsewhere, long IPv6 extension header chains, neighbour discovery
// typed packets to an off-link peer, a connection's origin flipped by the
// peer after its policy was revoked, and a conntrack entry made on another
// workload's device. Every attack must not reach a socket on the other side
// that would read it, and must be counted as a drop of its reason; beside
// each, an allowed counterpart (or a control with no policy in force) is
// delivered, so that the assertion can fail.
//
// The network: the endpoint (e2e's epNS, 10.201.0.2 and fd00:201::2 on
// eth0) behind ipcah0; a second endpoint (10.203.0.2, fd00:203::2) behind
// ipcah1, both in --devices; the host namespace routes (forwarding on) to a
// peer namespace behind ipcapr0 (not enforced), whose loopback holds an
// address of an allowed network (10.20.0.1, fd00:20::1) and one of a denied
// network (10.99.0.1, fd00:99::1): off-link for the endpoints, and not the
// host's.

const (
	peerDevice   = "ipcapr0"
	secondDevice = "ipcah1"

	peerAllowed4 = "10.20.0.1"
	peerDenied4  = "10.99.0.1"
	peerAllowed6 = "fd00:20::1"
	peerDenied6  = "fd00:99::1"

	secondEPAddr  = "10.203.0.2"
	secondEPAddr6 = "fd00:203::2"
)

// notDeliveredWithin is how long a listener is watched for a packet that
// must not arrive; an allowed one arrives in milliseconds (its
// counterpart's wait shows it).
const notDeliveredWithin = 500 * time.Millisecond

// deliveredWithin bounds the wait for a packet that must arrive.
const deliveredWithin = 2 * time.Second

// listeners are raw sockets of one namespace, by family and protocol.
type listeners struct {
	tcp4, udp4, icmp4, tcp6, udp6, icmp6 *craft.Listener
}

func listen(t *testing.T, ns string) listeners {
	return listeners{
		tcp4:  craft.Listen(t, ns, unix.AF_INET, unix.IPPROTO_TCP),
		udp4:  craft.Listen(t, ns, unix.AF_INET, unix.IPPROTO_UDP),
		icmp4: craft.Listen(t, ns, unix.AF_INET, unix.IPPROTO_ICMP),
		tcp6:  craft.Listen(t, ns, unix.AF_INET6, unix.IPPROTO_TCP),
		udp6:  craft.Listen(t, ns, unix.AF_INET6, unix.IPPROTO_UDP),
		icmp6: craft.Listen(t, ns, unix.AF_INET6, unix.IPPROTO_ICMPV6),
	}
}

// bypassRig is e2e's rig with the network above.
type bypassRig struct {
	*e2e
	peerNS, secondNS string
	// Frame senders: from the endpoint's eth0 (to ipcah0), from the host
	// side's ipcah0 (to the endpoint: through TCX egress), from the peer's
	// eth0 (to the host, which routes to the endpoint), from the second
	// endpoint's eth0 (to ipcah1).
	fromEP, fromHost, fromPeer, fromSecond *craft.Sender
	// What the endpoint's and the peer's kernels deliver locally.
	atEP, atPeer listeners
	agentArgs    []string
}

func newBypassRig(t *testing.T) *bypassRig {
	e := newE2E(t)
	b := &bypassRig{e2e: e,
		peerNS:    strings.Replace(e.epNS, "ipca-ep-", "ipca-peer-", 1),
		secondNS:  strings.Replace(e.epNS, "ipca-ep-", "ipca-ep2-", 1),
		agentArgs: []string{"--devices=" + secondDevice},
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", b.peerNS).Run()
		exec.Command("ip", "netns", "del", b.secondNS).Run()
	})
	host, ep := e.hostNS, e.epNS
	sysctl := func(ns, kv string) { mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", kv) }

	// IPv6 on the endpoint's link, and a default route through the host.
	mustRun(t, "ip", "-n", host, "addr", "add", hostSideAddr6+"/64", "dev", e2eDevice, "nodad")
	mustRun(t, "ip", "-n", ep, "addr", "add", epAddr6+"/64", "dev", "eth0", "nodad")
	mustRun(t, "ip", "-n", ep, "-6", "route", "add", "default", "via", hostSideAddr6)

	// The peer, routed to by the host.
	mustRun(t, "ip", "netns", "add", b.peerNS)
	mustRun(t, "ip", "-n", host, "link", "add", peerDevice, "type", "veth", "peer", "name", "eth0", "netns", b.peerNS)
	mustRun(t, "ip", "-n", host, "addr", "add", "10.202.0.1/24", "dev", peerDevice)
	mustRun(t, "ip", "-n", host, "addr", "add", "fd00:202::1/64", "dev", peerDevice, "nodad")
	mustRun(t, "ip", "-n", host, "link", "set", peerDevice, "up")
	for _, prefix := range []string{"10.20.0.0/16", "10.99.0.0/16"} {
		mustRun(t, "ip", "-n", host, "route", "add", prefix, "via", "10.202.0.2")
	}
	for _, prefix := range []string{"fd00:20::/64", "fd00:99::/64"} {
		mustRun(t, "ip", "-n", host, "-6", "route", "add", prefix, "via", "fd00:202::2")
	}
	sysctl(host, "net.ipv4.ip_forward=1")
	sysctl(host, "net.ipv6.conf.all.forwarding=1")
	mustRun(t, "ip", "-n", b.peerNS, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", b.peerNS, "addr", "add", "10.202.0.2/24", "dev", "eth0")
	mustRun(t, "ip", "-n", b.peerNS, "addr", "add", "fd00:202::2/64", "dev", "eth0", "nodad")
	mustRun(t, "ip", "-n", b.peerNS, "link", "set", "eth0", "up")
	for _, addr := range []string{peerAllowed4 + "/32", peerDenied4 + "/32", peerAllowed6 + "/128", peerDenied6 + "/128"} {
		mustRun(t, "ip", "-n", b.peerNS, "addr", "add", addr, "dev", "lo")
	}
	mustRun(t, "ip", "-n", b.peerNS, "route", "add", "default", "via", "10.202.0.1")
	mustRun(t, "ip", "-n", b.peerNS, "-6", "route", "add", "default", "via", "fd00:202::1")

	// The second endpoint.
	mustRun(t, "ip", "netns", "add", b.secondNS)
	mustRun(t, "ip", "-n", host, "link", "add", secondDevice, "type", "veth", "peer", "name", "eth0", "netns", b.secondNS)
	mustRun(t, "ip", "-n", host, "addr", "add", "10.203.0.1/24", "dev", secondDevice)
	mustRun(t, "ip", "-n", host, "addr", "add", "fd00:203::1/64", "dev", secondDevice, "nodad")
	mustRun(t, "ip", "-n", host, "link", "set", secondDevice, "up")
	mustRun(t, "ip", "-n", b.secondNS, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", b.secondNS, "addr", "add", secondEPAddr+"/24", "dev", "eth0")
	mustRun(t, "ip", "-n", b.secondNS, "addr", "add", secondEPAddr6+"/64", "dev", "eth0", "nodad")
	mustRun(t, "ip", "-n", b.secondNS, "link", "set", "eth0", "up")
	mustRun(t, "ip", "-n", b.secondNS, "route", "add", "default", "via", "10.203.0.1")

	for _, addr := range []string{peerAllowed4, peerDenied4, peerAllowed6, peerDenied6} {
		require.Eventually(t, func() bool { return pingsFrom(ep, addr) }, 10*time.Second, 50*time.Millisecond,
			"the endpoint reaches %s before any agent runs", addr)
	}
	require.Eventually(t, func() bool { return pingsFrom(b.secondNS, peerAllowed4) }, 10*time.Second, 50*time.Millisecond,
		"the second endpoint reaches %s before any agent runs", peerAllowed4)

	b.fromEP = craft.OpenSender(t, ep, "eth0", craft.HardwareAddr(t, host, e2eDevice))
	b.fromHost = craft.OpenSender(t, host, e2eDevice, craft.HardwareAddr(t, ep, "eth0"))
	b.fromPeer = craft.OpenSender(t, b.peerNS, "eth0", craft.HardwareAddr(t, host, peerDevice))
	b.fromSecond = craft.OpenSender(t, b.secondNS, "eth0", craft.HardwareAddr(t, host, secondDevice))
	b.atEP, b.atPeer = listen(t, ep), listen(t, b.peerNS)
	return b
}

// on points the rig at the subtest t and has the agent run.
func (b *bypassRig) on(t *testing.T) { b.scenario(t, b.agentArgs...) }

// drops is datapath/counters' count of packets dropped in direction
// ("ingress", "egress": the endpoint's) for the reason named reason.
func (b *bypassRig) drops(direction, reason string) uint64 {
	b.t.Helper()
	var counters map[string]struct {
		Drops map[string]struct{ Packets uint64 } `json:"drops"`
	}
	out := b.shell("datapath/counters", "-o", "json")
	require.NoError(b.t, json.Unmarshal([]byte(out), &counters), "datapath/counters -o json: %s", out)
	return counters[direction].Drops[reason].Packets
}

// attack is traffic that must not reach the other side.
type attack struct {
	name string
	// direction is the endpoint's ("egress": sent by the endpoint) and
	// reason the name of the drop reason it must be counted with.
	direction, reason string
	at                *craft.Listener
	send              func(marker []byte) error
}

// requireDropped runs a as a subtest: what it sends must not reach its
// listener, and the program must count a drop of its reason meanwhile.
// Both are checked (and reported) whatever the other shows.
func (b *bypassRig) requireDropped(t *testing.T, a attack) {
	t.Run(a.name, func(t *testing.T) {
		b.on(t)
		before := b.drops(a.direction, a.reason)
		marker := craft.Marker(a.name)
		if err := a.send(marker); err != nil {
			// Dropped by TCX egress of the host side (to the endpoint):
			// the counters say by whom and why.
			require.ErrorIs(t, err, craft.ErrDroppedOnTransmit)
		}
		delivered := a.at.WaitFor(marker, notDeliveredWithin)
		after := b.drops(a.direction, a.reason)
		assert.False(t, delivered, "the attack got through: the listener read %q", marker)
		assert.Greater(t, after, before, "no %s drop counted for reason %q; datapath/counters:\n%s",
			a.direction, a.reason, b.shell("datapath/counters"))
	})
}

// requireDelivered is the counterpart: what send sends reaches at.
func (b *bypassRig) requireDelivered(t *testing.T, name string, at *craft.Listener, send func(marker []byte) error) {
	t.Helper()
	marker := craft.Marker(name)
	require.NoError(t, send(marker))
	require.True(t, at.WaitFor(marker, deliveredWithin), "%s: not delivered (the path itself does not work)", name)
}

// ipLayer is an IPv4 or IPv6 header from src to dst.
func ipLayer(src, dst string) gopacket.SerializableLayer {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	if s.Is4() {
		return &layers.IPv4{SrcIP: s.AsSlice(), DstIP: d.AsSlice()}
	}
	return &layers.IPv6{SrcIP: s.AsSlice(), DstIP: d.AsSlice()}
}

// syn is a TCP SYN carrying payload (data on a SYN is legal, and a raw
// socket reads it).
func syn(src, dst string, sport, dport uint16, payload []byte) []byte {
	return craft.MustSerialize(ipLayer(src, dst),
		&layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: true, Seq: 1000, Window: 64240},
		gopacket.Payload(payload))
}

// pshAck is a TCP segment with data, as within a connection.
func pshAck(src, dst string, sport, dport uint16, payload []byte) []byte {
	return craft.MustSerialize(ipLayer(src, dst),
		&layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), PSH: true, ACK: true,
			Seq: 5000, Ack: 7000, Window: 64240},
		gopacket.Payload(payload))
}

func udp(src, dst string, sport, dport uint16, payload []byte) []byte {
	return craft.MustSerialize(ipLayer(src, dst),
		&layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)},
		gopacket.Payload(payload))
}

// icmpError is an ICMP (IPv4) or ICMPv6 error from src to dst that quotes
// quoted and carries extra after the quote. For IPv4's fragmentation
// needed and ICMPv6's packet too big it says MTU 1280.
func icmpError(src, dst string, typ, code uint8, quoted, extra []byte) []byte {
	if netip.MustParseAddr(src).Is4() {
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code)}
		if typ == layers.ICMPv4TypeDestinationUnreachable && code == layers.ICMPv4CodeFragmentationNeeded {
			icmp.Seq = 1280
		}
		return craft.MustSerialize(ipLayer(src, dst), icmp, gopacket.Payload(craft.Quote(quoted, extra)))
	}
	word := make([]byte, 4) // unused, or the MTU of a packet too big
	if typ == layers.ICMPv6TypePacketTooBig {
		binary.BigEndian.PutUint32(word, 1280)
	}
	return craft.MustSerialize(ipLayer(src, dst),
		&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)},
		gopacket.Payload(append(word, craft.Quote(quoted, extra)...)))
}

// family is one IP family's addresses (the endpoint's, the peer's allowed
// and denied ones, and another on the endpoint's link that nobody has) and
// listeners, and the ICMP errors it has.
type family struct {
	name                             string
	ep, allowed, denied, spoofed     string
	tcpAtPeer, udpAtPeer, icmpAtPeer *craft.Listener
	tcpAtEP, udpAtEP, icmpAtEP       *craft.Listener
	icmpErrors                       []icmpType
}

type icmpType struct {
	name      string
	typ, code uint8
}

func (b *bypassRig) families() []family {
	return []family{{
		name: "IPv4", ep: epAddr, allowed: peerAllowed4, denied: peerDenied4, spoofed: "10.201.0.3",
		tcpAtPeer: b.atPeer.tcp4, udpAtPeer: b.atPeer.udp4, icmpAtPeer: b.atPeer.icmp4,
		tcpAtEP: b.atEP.tcp4, udpAtEP: b.atEP.udp4, icmpAtEP: b.atEP.icmp4,
		icmpErrors: []icmpType{
			{"destination unreachable", layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodePort},
			{"time exceeded", layers.ICMPv4TypeTimeExceeded, layers.ICMPv4CodeTTLExceeded},
			{"fragmentation needed", layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded},
		},
	}, {
		name: "IPv6", ep: epAddr6, allowed: peerAllowed6, denied: peerDenied6, spoofed: "fd00:201::3",
		tcpAtPeer: b.atPeer.tcp6, udpAtPeer: b.atPeer.udp6, icmpAtPeer: b.atPeer.icmp6,
		tcpAtEP: b.atEP.tcp6, udpAtEP: b.atEP.udp6, icmpAtEP: b.atEP.icmp6,
		icmpErrors: []icmpType{
			{"destination unreachable", layers.ICMPv6TypeDestinationUnreachable, layers.ICMPv6CodePortUnreachable},
			{"time exceeded", layers.ICMPv6TypeTimeExceeded, layers.ICMPv6CodeHopLimitExceeded},
			{"packet too big", layers.ICMPv6TypePacketTooBig, 0},
		},
	}}
}

// bypassPolicy allows the peer's allowed networks and denies its denied
// ones, both ways.
const bypassPolicy = `name: bypass
egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
egressDeny:
  - toCIDR: ["10.99.0.0/16", "fd00:99::/64"]
ingress:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
ingressDeny:
  - fromCIDR: ["10.99.0.0/16", "fd00:99::/64"]
`

// The TestPrivilegedBypasses tests send each known bypass through the real
// agent binary (see the comment at the top of this file). They are four
// tests, each on a rig of its own, rather than one: the package runs
// tests in parallel, and one test of every case in a row was the longest
// of them.

func TestPrivilegedBypassesVLAN(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	t.Run("in-band VLAN tags", b.vlanTags)
}

func TestPrivilegedBypassesVLANEndpointICMP(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	t.Run("in-band VLAN tags from an endpoint with its own policy", b.vlanTagsOfEndpoint)
	t.Run("ICMP errors about an allowed flow", b.icmpErrors)
}

func TestPrivilegedBypassesHeadersND(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	t.Run("IPv6 extension header chains", b.extensionHeaders)
	t.Run("neighbour discovery only on-link", b.neighbourDiscovery)
}

func TestPrivilegedBypassesConntrack(t *testing.T) {
	t.Parallel()
	b := newBypassRig(t)
	t.Run("a revoked egress policy stops a two-way flow", b.revocation)
	t.Run("conntrack entries are bound to their device", b.deviceBinding)
	t.Run("a source address of another device is dropped", b.spoofedSource)
}

// vlanTags: the kernel moves the outer VLAN tag of a received frame to
// metadata before TCX ingress, so the program sees the next tag's
// EtherType; after TCX it strips priority tags (VID 0) one by one and
// hands the IP packet inside to IP. A frame with a tag left in-band is
// dropped in an enforced direction (vlan-tagged). To the endpoint, frames
// the host side sends keep every tag in-band at TCX egress, and the
// endpoint's kernel strips them.
func (b *bypassRig) vlanTags(t *testing.T) {
	b.on(t)
	q0, ad0 := craft.Tag{TPID: craft.TPID8021Q}, craft.Tag{TPID: craft.TPID8021AD}
	stacks := []struct {
		name string
		tags []craft.Tag
	}{
		{"802.1Q+802.1Q", []craft.Tag{q0, q0}},
		{"802.1ad+802.1Q", []craft.Tag{ad0, q0}},
		{"three tags", []craft.Tag{q0, q0, q0}},
	}

	// The control: with no policy in force, this kernel delivers what
	// is inside stacked priority tags, both ways.
	b.usePolicies(nil)
	for _, f := range b.families() {
		b.requireDelivered(t, f.name+" two priority tags from the endpoint, no policy", f.tcpAtPeer, func(m []byte) error {
			return b.fromEP.SendIP(syn(f.ep, f.denied, 40000, 22, m), q0, q0)
		})
		b.requireDelivered(t, f.name+" two priority tags to the endpoint, no policy", f.udpAtEP, func(m []byte) error {
			return b.fromHost.SendIP(udp(f.denied, f.ep, 40000, 5353, m), q0, q0)
		})
	}

	b.usePolicies(map[string]string{"bypass.yaml": bypassPolicy})
	for _, f := range b.families() {
		b.requireDelivered(t, f.name+" untagged to the allowed peer", f.tcpAtPeer, func(m []byte) error {
			return b.fromEP.SendIP(syn(f.ep, f.allowed, 40000, 22, m))
		})
		// A single tag is metadata by TCX ingress: the program sees IP.
		b.requireDelivered(t, f.name+" one priority tag to the allowed peer", f.tcpAtPeer, func(m []byte) error {
			return b.fromEP.SendIP(syn(f.ep, f.allowed, 40000, 22, m), q0)
		})
		b.requireDelivered(t, f.name+" untagged from the allowed peer", f.udpAtEP, func(m []byte) error {
			return b.fromHost.SendIP(udp(f.allowed, f.ep, 40000, 5353, m))
		})
		b.requireDropped(t, attack{name: f.name + " untagged to the denied peer", direction: "egress", reason: "policy-deny",
			at: f.tcpAtPeer, send: func(m []byte) error { return b.fromEP.SendIP(syn(f.ep, f.denied, 40000, 22, m)) }})
		b.requireDropped(t, attack{name: f.name + " untagged from the denied peer", direction: "ingress", reason: "policy-deny",
			at: f.udpAtEP, send: func(m []byte) error { return b.fromHost.SendIP(udp(f.denied, f.ep, 40000, 5353, m)) }})
		// The single tag is metadata, so the program sees IP and the deny:
		// what the stacked tags below hide is what the program sees here.
		b.requireDropped(t, attack{name: f.name + " TCP to the denied peer behind one priority tag", direction: "egress",
			reason: "policy-deny", at: f.tcpAtPeer,
			send: func(m []byte) error { return b.fromEP.SendIP(syn(f.ep, f.denied, 40000, 22, m), q0) }})
		// At TCX egress nothing moved it: the frame still says 0x8100.
		b.requireDropped(t, attack{name: f.name + " UDP from the denied peer behind one priority tag", direction: "ingress",
			reason: "vlan-tagged", at: f.udpAtEP,
			send: func(m []byte) error { return b.fromHost.SendIP(udp(f.denied, f.ep, 40000, 5353, m), q0) }})

		for _, stack := range stacks {
			b.requireDropped(t, attack{name: f.name + " TCP to the denied peer behind " + stack.name,
				direction: "egress", reason: "vlan-tagged", at: f.tcpAtPeer,
				send: func(m []byte) error { return b.fromEP.SendIP(syn(f.ep, f.denied, 40000, 22, m), stack.tags...) }})
			b.requireDropped(t, attack{name: f.name + " UDP to the denied peer behind " + stack.name,
				direction: "egress", reason: "vlan-tagged", at: f.udpAtPeer,
				send: func(m []byte) error { return b.fromEP.SendIP(udp(f.ep, f.denied, 40000, 5353, m), stack.tags...) }})
			b.requireDropped(t, attack{name: f.name + " UDP from the denied peer behind " + stack.name,
				direction: "ingress", reason: "vlan-tagged", at: f.udpAtEP,
				send: func(m []byte) error { return b.fromHost.SendIP(udp(f.denied, f.ep, 40000, 5353, m), stack.tags...) }})
		}
	}
}

// endpointBypassPolicy is bypassPolicy for the endpoint labelled
// app=web only: the host-wide default is not enforced.
const endpointBypassPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: bypass-web, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
  egressDeny:
  - toCIDR: ["10.99.0.0/16", "fd00:99::/64"]
  ingress:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
  ingressDeny:
  - fromCIDR: ["10.99.0.0/16", "fd00:99::/64"]
`

// vlanTagsOfEndpoint: a tag left in-band hides the address that says
// whose traffic a frame is, so it is dropped where any endpoint's
// direction is enforced, even though the host-wide default (which the
// second endpoint's untagged traffic shows) is not.
func (b *bypassRig) vlanTagsOfEndpoint(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(fmt.Sprintf(
		"apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: web, labels: {app: web}}\n"+
			"spec: {addresses: [%s, \"%s\"], interface: %s}\n", epAddr, epAddr6, e2eDevice)), 0o600))
	defaultArgs := b.agentArgs
	b.agentArgs = append(slices.Clone(defaultArgs), "--endpoint-dir="+dir, "--node-name=node-a")
	t.Cleanup(func() { b.agentArgs = defaultArgs })
	b.on(t)
	// The endpoint's own policy is in the tables only once the agent has
	// read its file: usePolicies waits for the tables, not for it.
	require.Eventually(t, func() bool {
		_, err := b.tryShell("endpoint/get", "default/web")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "endpoint default/web registered; agent log:\n%s", b.agentLog)
	b.usePolicies(map[string]string{"bypass-web.yaml": endpointBypassPolicy})

	q0 := craft.Tag{TPID: craft.TPID8021Q}
	for i, f := range b.families() {
		second := secondEPAddr
		if f.name == "IPv6" {
			second = secondEPAddr6
		}
		port := uint16(43000 + 10*i)
		b.requireDelivered(t, f.name+" the default's untagged UDP to the denied peer", f.udpAtPeer, func(m []byte) error {
			return b.fromSecond.SendIP(udp(second, f.denied, port, 5353, m))
		})
		b.requireDelivered(t, f.name+" the endpoint's untagged TCP to the allowed peer", f.tcpAtPeer, func(m []byte) error {
			return b.fromEP.SendIP(syn(f.ep, f.allowed, port, 22, m))
		})
		b.requireDropped(t, attack{name: f.name + " the endpoint's untagged TCP to the denied peer", direction: "egress",
			reason: "policy-deny", at: f.tcpAtPeer,
			send: func(m []byte) error { return b.fromEP.SendIP(syn(f.ep, f.denied, port, 22, m)) }})
		// (Tags of any TPID reach the same check: vlanTags tries them.)
		b.requireDropped(t, attack{name: f.name + " the endpoint's TCP to the denied peer behind two priority tags",
			direction: "egress", reason: "vlan-tagged", at: f.tcpAtPeer,
			send: func(m []byte) error { return b.fromEP.SendIP(syn(f.ep, f.denied, port+1, 22, m), q0, q0) }})
		b.requireDropped(t, attack{name: f.name + " UDP from the denied peer to the endpoint behind two priority tags",
			direction: "ingress", reason: "vlan-tagged", at: f.udpAtEP,
			send: func(m []byte) error { return b.fromHost.SendIP(udp(f.denied, f.ep, port+2, 5353, m), q0, q0) }})
	}
}

// icmpErrorsPolicy allows only TCP 443 to the allowed networks (an ICMP
// error there passes only as related to a tracked flow), denies the denied
// networks, and enforces ingress with an allow of an unrelated network.
const icmpErrorsPolicy = `name: icmp-errors
egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 443, protocol: TCP}]
egressDeny:
  - toCIDR: ["10.99.0.0/16", "fd00:99::/64"]
ingress:
  - fromCIDR: ["10.250.0.0/16"]
ingressDeny:
  - fromCIDR: ["10.99.0.0/16", "fd00:99::/64"]
`

// icmpErrors: an ICMP error passes as related only when it is consistent
// with the flow it quotes: its destination is the quoted packet's source,
// and one the endpoint sends comes from the quoted packet's destination.
// Deny rules apply to the outer peer. The attacks quote a real, tracked
// connection to allowed:443 and carry a payload after the quote.
func (b *bypassRig) icmpErrors(t *testing.T) {
	b.on(t)
	b.usePolicies(map[string]string{"icmp-errors.yaml": icmpErrorsPolicy})
	for _, f := range b.families() {
		netnstest.EchoTCP(t, b.peerNS, net.JoinHostPort(f.allowed, "443"))
		var c net.Conn
		require.NoError(t, netnstest.InNetns(t, b.epNS, func() (err error) {
			c, err = net.DialTimeout("tcp", net.JoinHostPort(f.allowed, "443"), 2*time.Second)
			return err
		}), "the allowed flow")
		t.Cleanup(func() { c.Close() })
		require.NoError(t, (&ctConn{t: t, c: c}).exchange("flow", 2*time.Second), "the allowed flow carries data")
		sport := uint16(c.LocalAddr().(*net.TCPAddr).Port)
		// What the flow carries: the endpoint's packets, and the peer's.
		forward := pshAck(f.ep, f.allowed, sport, 443, nil)
		reply := pshAck(f.allowed, f.ep, 443, sport, nil)

		for _, typ := range f.icmpErrors {
			errorFrom := func(s *craft.Sender, src, dst string, quoted []byte) func(m []byte) error {
				return func(m []byte) error { return s.SendIP(icmpError(src, dst, typ.typ, typ.code, quoted, m)) }
			}
			name := f.name + " " + typ.name
			b.requireDelivered(t, name+" from the endpoint to the flow's peer", f.icmpAtPeer,
				errorFrom(b.fromEP, f.ep, f.allowed, reply))
			b.requireDropped(t, attack{name: name + " quoting the flow, from the endpoint to a denied peer",
				direction: "egress", reason: "policy-deny", at: f.icmpAtPeer,
				send: errorFrom(b.fromEP, f.ep, f.denied, reply)})
			// Consistent destination, a source that is not the flow's:
			// policy decides, and allows no ICMP there.
			b.requireDropped(t, attack{name: name + " quoting the flow, from another source to the flow's peer",
				direction: "egress", reason: "no-policy", at: f.icmpAtPeer,
				send: errorFrom(b.fromEP, f.spoofed, f.allowed, reply)})
			b.requireDelivered(t, name+" from the flow's peer to the endpoint", f.icmpAtEP,
				errorFrom(b.fromPeer, f.allowed, f.ep, forward))
			b.requireDropped(t, attack{name: name + " quoting the flow, from a denied peer to the endpoint",
				direction: "ingress", reason: "policy-deny", at: f.icmpAtEP,
				send: errorFrom(b.fromPeer, f.denied, f.ep, forward)})
		}
	}
}

// extensionHeadersPolicy allows the allowed networks but TCP 22 and UDP
// 5353, both ways.
const extensionHeadersPolicy = `name: ext-headers
egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
egressDeny:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 22, protocol: TCP}, {port: 5353, protocol: UDP}]
ingress:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
ingressDeny:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 22, protocol: TCP}, {port: 5353, protocol: UDP}]
`

// withOptions is an IPv6 packet with n destination options headers before
// TCP (a SYN) or UDP, carrying payload.
func withOptions(src, dst string, n int, proto string, dport uint16, payload []byte) []byte {
	var l4 gopacket.SerializableLayer = &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(dport)}
	if proto == "TCP" {
		l4 = &layers.TCP{SrcPort: 40000, DstPort: layers.TCPPort(dport), SYN: true, Seq: 1000, Window: 64240}
	}
	return craft.MustSerialize(ipLayer(src, dst), &craft.DestinationOptions{Count: n}, l4, gopacket.Payload(payload))
}

// extensionHeaders: IPv6 extension header chains are walked to the end,
// up to 8 headers; a longer chain is dropped (ext-headers). Before, the
// walk stopped at 4 and matched the packet by next header 60 with no port,
// which an L3 allow passes and a port deny does not match.
func (b *bypassRig) extensionHeaders(t *testing.T) {
	b.on(t)
	// The control: this kernel delivers a chain of nine both ways.
	b.usePolicies(nil)
	b.requireDelivered(t, "nine headers from the endpoint, no policy", b.atPeer.udp6, func(m []byte) error {
		return b.fromEP.SendIP(withOptions(epAddr6, peerAllowed6, 9, "UDP", 5353, m))
	})
	b.requireDelivered(t, "nine headers to the endpoint, no policy", b.atEP.udp6, func(m []byte) error {
		return b.fromPeer.SendIP(withOptions(peerAllowed6, epAddr6, 9, "UDP", 5353, m))
	})

	b.usePolicies(map[string]string{"ext-headers.yaml": extensionHeadersPolicy})
	for _, d := range []struct {
		direction, src, dst string
		from                *craft.Sender
		at                  listeners
	}{
		{"egress", epAddr6, peerAllowed6, b.fromEP, b.atPeer},
		{"ingress", peerAllowed6, epAddr6, b.fromPeer, b.atEP},
	} {
		listener := map[string]*craft.Listener{"TCP": d.at.tcp6, "UDP": d.at.udp6}
		denied := map[string]uint16{"TCP": 22, "UDP": 5353}
		for _, proto := range []string{"TCP", "UDP"} {
			send := func(n int, port uint16) func(m []byte) error {
				return func(m []byte) error { return d.from.SendIP(withOptions(d.src, d.dst, n, proto, port, m)) }
			}
			name := fmt.Sprintf("%s %s", d.direction, proto)
			b.requireDelivered(t, name+" behind five headers to an allowed port", listener[proto], send(5, denied[proto]+1))
			b.requireDelivered(t, name+" behind eight headers to an allowed port", listener[proto], send(8, denied[proto]+1))
			b.requireDropped(t, attack{name: name + " to the denied port", direction: d.direction, reason: "policy-deny",
				at: listener[proto], send: send(0, denied[proto])})
			b.requireDropped(t, attack{name: name + " behind five headers to the denied port", direction: d.direction,
				reason: "policy-deny", at: listener[proto], send: send(5, denied[proto])})
			b.requireDropped(t, attack{name: name + " behind nine headers to the denied port", direction: d.direction,
				reason: "ext-headers", at: listener[proto], send: send(9, denied[proto])})
			b.requireDropped(t, attack{name: name + " behind nine headers to an allowed port", direction: d.direction,
				reason: "ext-headers", at: listener[proto], send: send(9, denied[proto]+1)})
		}
	}
}

// ndTyped is an ICMPv6 packet of a neighbour discovery type (133-137) with
// hop limit 255, as neighbour discovery is sent: its 4 bytes after the
// checksum, a target address (dst), then payload.
func ndTyped(src, dst string, typ uint8, payload []byte) []byte {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	body := append(make([]byte, 4), d.AsSlice()...)
	return craft.MustSerialize(&layers.IPv6{SrcIP: s.AsSlice(), DstIP: d.AsSlice(), HopLimit: 255},
		&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, 0)}, gopacket.Payload(append(body, payload...)))
}

// neighbourDiscovery: ICMPv6 133-137 with hop limit 255 is exempt from
// policy only on-link (from the endpoint: to a link-local or ff02::/16
// address, or one of the host's); sent to an off-link denied peer it is
// decided by policy. Real neighbour discovery keeps working.
func (b *bypassRig) neighbourDiscovery(t *testing.T) {
	b.on(t)
	b.usePolicies(nil)
	b.requireDelivered(t, "neighbour solicitation typed to the denied peer, no policy", b.atPeer.icmp6, func(m []byte) error {
		return b.fromEP.SendIP(ndTyped(epAddr6, peerDenied6, layers.ICMPv6TypeNeighborSolicitation, m))
	})

	b.usePolicies(map[string]string{"bypass.yaml": bypassPolicy})
	// Real neighbour discovery under enforcement of both directions: with
	// both neighbour caches emptied, a ping needs solicitations and
	// advertisements both ways.
	mustRun(t, "ip", "-n", b.epNS, "-6", "neigh", "flush", "all")
	mustRun(t, "ip", "-n", b.hostNS, "-6", "neigh", "flush", "dev", e2eDevice)
	b.expect(pingProbe(b.epNS, peerAllowed6, answered), pingProbe(b.epNS, peerDenied6, lost))
	b.requireDelivered(t, "neighbour solicitation typed to the allowed peer", b.atPeer.icmp6, func(m []byte) error {
		return b.fromEP.SendIP(ndTyped(epAddr6, peerAllowed6, layers.ICMPv6TypeNeighborSolicitation, m))
	})
	for typ := uint8(layers.ICMPv6TypeRouterSolicitation); typ <= layers.ICMPv6TypeRedirect; typ++ {
		b.requireDropped(t, attack{name: fmt.Sprintf("type %d to the denied peer", typ),
			direction: "egress", reason: "policy-deny", at: b.atPeer.icmp6,
			send: func(m []byte) error { return b.fromEP.SendIP(ndTyped(epAddr6, peerDenied6, typ, m)) }})
	}
}

// Before and after the revocation: the flows' ports are allowed, then only
// another port is (no-policy for them). Ingress is never enforced.
const (
	revocationBefore = `name: revocation
egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 7100, protocol: TCP}, {port: 7101, protocol: UDP}]
`
	revocationAfter = `name: revocation
egress:
  - toCIDR: ["10.20.0.0/16", "fd00:20::/64"]
    toPorts: [{port: 7200, protocol: TCP}]
`
)

// flow carries data between the endpoint and the peer both ways, all the
// time (each side writes every 10 ms), and counts what each side reads.
type flow struct {
	name string
	// fromEP is the bytes the peer read, toEP those the endpoint read.
	fromEP, toEP atomic.Int64
	stop         chan struct{}
	wg           sync.WaitGroup
}

// pump writes to w every 10 ms until the flow stops or w fails (closed).
func (f *flow) pump(w func([]byte) error) {
	f.wg.Go(func() {
		msg := make([]byte, 64)
		for {
			select {
			case <-f.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := w(msg); err != nil && !errors.Is(err, errNoPeerYet) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue // a full send buffer: the other side reads nothing
				}
				return
			}
		}
	})
}

// count adds what read returns to n until it fails (closed).
func (f *flow) count(n *atomic.Int64, read func([]byte) (int, error)) {
	f.wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			got, err := read(buf)
			n.Add(int64(got))
			if err != nil {
				return
			}
		}
	})
}

var errNoPeerYet = errors.New("the peer has not heard from the endpoint yet")

// tcpFlow is a connection from the endpoint to addr in the peer's
// namespace.
func (b *bypassRig) tcpFlow(t *testing.T, addr string) *flow {
	f := &flow{name: "TCP " + addr, stop: make(chan struct{})}
	var l net.Listener
	require.NoError(t, netnstest.InNetns(t, b.peerNS, func() (err error) { l, err = net.Listen("tcp", addr); return err }))
	defer l.Close()
	var c net.Conn
	require.NoError(t, netnstest.InNetns(t, b.epNS, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	}), "connect %s", addr)
	s, err := l.Accept()
	require.NoError(t, err)
	write := func(conn net.Conn) func([]byte) error {
		return func(msg []byte) error {
			conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, err := conn.Write(msg)
			return err
		}
	}
	f.pump(write(c))
	f.pump(write(s))
	f.count(&f.fromEP, s.Read)
	f.count(&f.toEP, c.Read)
	t.Cleanup(func() { close(f.stop); c.Close(); s.Close(); f.wg.Wait() })
	return f
}

// udpFlow is datagrams from the endpoint to addr in the peer's namespace,
// and from there back to where they came from.
func (b *bypassRig) udpFlow(t *testing.T, addr string) *flow {
	f := &flow{name: "UDP " + addr, stop: make(chan struct{})}
	var s net.PacketConn
	require.NoError(t, netnstest.InNetns(t, b.peerNS, func() (err error) { s, err = net.ListenPacket("udp", addr); return err }))
	var c net.Conn
	require.NoError(t, netnstest.InNetns(t, b.epNS, func() (err error) { c, err = net.Dial("udp", addr); return err }))
	var endpoint atomic.Pointer[net.Addr]
	f.pump(func(msg []byte) error { _, err := c.Write(msg); return err })
	f.pump(func(msg []byte) error {
		to := endpoint.Load()
		if to == nil {
			return errNoPeerYet
		}
		_, err := s.WriteTo(msg, *to)
		return err
	})
	f.count(&f.fromEP, func(buf []byte) (int, error) {
		n, from, err := s.ReadFrom(buf)
		if err == nil {
			endpoint.Store(&from)
		}
		return n, err
	})
	f.count(&f.toEP, c.Read)
	t.Cleanup(func() { close(f.stop); c.Close(); s.Close(); f.wg.Wait() })
	return f
}

// revocation: a connection's origin never flips. Under an egress policy
// that allows them (ingress not enforced), a TCP connection and a UDP flow
// carry data both ways; the policy file is narrowed so that they are no
// longer allowed. Once the agent applied it, nothing more from the endpoint
// may reach the peer: the forward packets policy now drops must not see
// their entry deleted and then recreated by the peer's next packet (in a
// direction not enforced) as the peer's connection, whose replies the
// endpoint's packets would then be.
func (b *bypassRig) revocation(t *testing.T) {
	b.on(t)
	b.usePolicies(map[string]string{"revocation.yaml": revocationBefore})
	var flows []*flow
	for _, f := range b.families() {
		flows = append(flows, b.tcpFlow(t, net.JoinHostPort(f.allowed, "7100")), b.udpFlow(t, net.JoinHostPort(f.allowed, "7101")))
	}
	require.Eventually(t, func() bool {
		for _, f := range flows {
			if f.fromEP.Load() == 0 || f.toEP.Load() == 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "every flow carries data both ways under the allowing policy")
	// A flow's data keeps passing while the policy allows it.
	time.Sleep(300 * time.Millisecond)
	before := make([]int64, len(flows))
	for i, f := range flows {
		before[i] = f.fromEP.Load()
	}
	time.Sleep(300 * time.Millisecond)
	for i, f := range flows {
		require.Greater(t, f.fromEP.Load(), before[i], "%s: the endpoint's data reaches the peer while allowed", f.name)
	}

	drops := b.drops("egress", "no-policy")
	b.usePolicies(map[string]string{"revocation.yaml": revocationAfter})
	const settle = 500 * time.Millisecond
	time.Sleep(settle)
	fromEP, toEP := make([]int64, len(flows)), make([]int64, len(flows))
	for i, f := range flows {
		fromEP[i], toEP[i] = f.fromEP.Load(), f.toEP.Load()
	}
	time.Sleep(2 * time.Second)
	for i, f := range flows {
		got := f.fromEP.Load() - fromEP[i]
		t.Logf("%s: after the revocation (from %v after it was applied, for 2 s): %d bytes from the endpoint reached the peer, %d bytes the other way",
			f.name, settle, got, f.toEP.Load()-toEP[i])
		assert.Zero(t, got, "%s: the endpoint's data reached the peer after its policy was revoked", f.name)
	}
	assert.Greater(t, b.drops("egress", "no-policy"), drops, "the revoked flows' packets counted as no-policy drops")
}

// deviceBindingPolicy enforces ingress and denies the denied networks
// there; egress is not enforced.
const deviceBindingPolicy = `name: device-binding
ingress:
  - fromCIDR: ["10.20.0.0/16", "fd00:20::/64"]
ingressDeny:
  - fromCIDR: ["10.99.0.0/16", "fd00:99::/64"]
`

// deviceBinding: a conntrack entry belongs to the device it was created
// on. A SYN the endpoint sends from its port 22 to the denied peer opens a
// connection whose replies pass; the same SYN sent by the second endpoint
// (through ipcah1) with the first one's address must not let the denied
// peer through to the first endpoint's port 22.
func (b *bypassRig) deviceBinding(t *testing.T) {
	b.on(t)
	b.usePolicies(map[string]string{"device-binding.yaml": deviceBindingPolicy})
	for i, f := range b.families() {
		port := uint16(41000 + 10*i)
		// The reply of a connection the endpoint opened passes.
		b.requireDelivered(t, f.name+" reply of the endpoint's own connection", f.tcpAtEP, func(m []byte) error {
			if err := b.synReachedPeer(f, b.fromEP, port); err != nil {
				return err
			}
			return b.fromPeer.SendIP(pshAck(f.denied, f.ep, port, 22, m))
		})
		b.requireDropped(t, attack{name: f.name + " denied peer to port 22, no connection", direction: "ingress",
			reason: "policy-deny", at: f.tcpAtEP,
			send: func(m []byte) error { return b.fromPeer.SendIP(pshAck(f.denied, f.ep, port+1, 22, m)) }})
		b.requireDropped(t, attack{name: f.name + " denied peer to port 22 after the second endpoint's SYN",
			direction: "ingress", reason: "policy-deny", at: f.tcpAtEP,
			send: func(m []byte) error {
				if err := b.synReachedPeer(f, b.fromSecond, port+2); err != nil {
					return err
				}
				return b.fromPeer.SendIP(pshAck(f.denied, f.ep, port+2, 22, m))
			}})
	}
}

// synReachedPeer sends, through from, a SYN from the endpoint's port 22 to
// the denied peer's port, and waits until the peer's kernel has it: the
// program created the connection's entry before it passed the SYN on, so
// the reply sent next meets it. A fixed pause instead let a busy machine
// deliver the reply first (the SYN carries a marker of its own, which the
// peer's raw socket reads).
//
// Possible errors: the send's; the SYN not at the peer within
// deliveredWithin.
func (b *bypassRig) synReachedPeer(f family, from *craft.Sender, port uint16) error {
	marker := craft.Marker(fmt.Sprintf("%s SYN to port %d", f.name, port))
	if err := from.SendIP(syn(f.ep, f.denied, 22, port, marker)); err != nil {
		return err
	}
	if !f.tcpAtPeer.WaitFor(marker, deliveredWithin) {
		return fmt.Errorf("the SYN to port %d did not reach the peer within %s", port, deliveredWithin)
	}
	return nil
}

// spoofedSource: with egress enforced, what the second endpoint sends with
// the first endpoint's address (which the host routes to ipcah0) is
// dropped as spoofed-source, even to an allowed peer; with its own
// address it passes.
func (b *bypassRig) spoofedSource(t *testing.T) {
	b.on(t)
	b.usePolicies(map[string]string{"bypass.yaml": bypassPolicy})
	for i, f := range b.families() {
		own := secondEPAddr
		if f.name == "IPv6" {
			own = secondEPAddr6
		}
		port := uint16(42000 + 10*i)
		b.requireDelivered(t, f.name+" second endpoint with its own address", f.udpAtPeer, func(m []byte) error {
			return b.fromSecond.SendIP(udp(own, f.allowed, port, 7000, m))
		})
		b.requireDropped(t, attack{name: f.name + " second endpoint with the first's address", direction: "egress",
			reason: "spoofed-source", at: f.udpAtPeer,
			send: func(m []byte) error { return b.fromSecond.SendIP(udp(f.ep, f.allowed, port+1, 7000, m)) }})
	}
}
