// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The program records the DNS answers over UDP that reach an endpoint
// without passing through the proxy (enforce.c, "DNS answers that bypass
// the proxy"), run with BPF_PROG_RUN on crafted packets: the endpoint's
// query (egress, allowed with verdict 3, no proxy socket: it goes to its
// server) makes the connection whose reply the answer is.

const (
	dnsRecProxyPort    = 40053
	dnsRecEndpointPort = 40000
)

// skbContext is the start of struct __sk_buff up to mark, the only field
// these tests set: BPF_PROG_RUN takes a prefix of it.
type skbContext struct {
	Len, PktType, Mark uint32
}

// dnsRecRig is the program with both directions enforced, the DNS servers
// (benchPeer, fragPeer6) allowed on UDP and TCP port 53 with verdict 3,
// and the dns-proxy map at dnsRecProxyPort (a proxy configured, none
// listening: the agent down).
type dnsRecRig struct {
	t      *testing.T
	maps   enforcerMaps
	enf    *enforcer
	reader *ringbuf.Reader
}

func newDNSRecRig(t *testing.T) *dnsRecRig {
	privileged.Test(t)
	maps := newTestEnforcerMaps(t)
	r := &dnsRecRig{t: t, maps: maps, enf: loadTestEnforcer(t, maps)}
	putIdentity(t, maps, netip.PrefixFrom(benchPeer, 32).String(), testIdentityAllowed)
	putIdentity(t, maps, netip.PrefixFrom(fragPeer6, 128).String(), testIdentityAllowed)
	for _, proto := range []uint8{testProtoUDP, testProtoTCP} {
		require.NoError(t, maps.Policy.Put(policyMapKey(testIdentityAllowed, uint8(policy.Egress), proto, 53),
			bpfmaps.NewPolicyValue(uint32(verdictDNSProxy))))
	}
	putEnforced(t, maps, policy.Egress, true)
	putEnforced(t, maps, policy.Ingress, true)
	r.setPort(dnsRecProxyPort)
	var err error
	r.reader, err = ringbuf.NewReader(maps.DNSAnswers)
	require.NoError(t, err)
	t.Cleanup(func() { r.reader.Close() })
	return r
}

func (r *dnsRecRig) setPort(port uint16) {
	r.t.Helper()
	require.NoError(r.t, r.maps.DNSProxy.Put(uint32(0), bpfmaps.NewDNSProxyValue(port)))
}

// run runs the program of direction on frame with the mark and returns
// its verdict.
func (r *dnsRecRig) run(direction policy.Direction, frame []byte, mark uint32) uint32 {
	r.t.Helper()
	prog := r.enf.fromEndpoint
	if direction == policy.Ingress {
		prog = r.enf.toEndpoint
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: skbContext{Mark: mark}})
	require.NoError(r.t, err)
	return ret
}

// records reads what the ring holds.
func (r *dnsRecRig) records() []bpfmaps.DNSAnswerRecord {
	r.t.Helper()
	return readDNSAnswers(r.t, r.reader)
}

// readDNSAnswers reads and decodes what reader's ring holds now.
func readDNSAnswers(t *testing.T, reader *ringbuf.Reader) []bpfmaps.DNSAnswerRecord {
	t.Helper()
	var got []bpfmaps.DNSAnswerRecord
	reader.SetDeadline(time.Now())
	for {
		rec, err := reader.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got
		}
		require.NoError(t, err)
		a, err := bpfmaps.DecodeDNSAnswer(rec.RawSample)
		require.NoError(t, err)
		got = append(got, a)
	}
}

// udpFrame is an Ethernet frame of a UDP datagram from src to dst.
func udpFrame(src, dst netip.AddrPort, payload []byte) []byte {
	l4 := udpHeader(src.Port(), dst.Port(), payload)
	if src.Addr().Is4() {
		return frame4(src.Addr(), dst.Addr(), testProtoUDP, l4)
	}
	return frame6(src.Addr(), dst.Addr(), nil, testProtoUDP, l4)
}

// dnsAnswerFor is a packed answer giving name the address a.
func dnsAnswerFor(t *testing.T, name string, a net.IP) []byte {
	t.Helper()
	m := new(dns.Msg).SetQuestion(name, dns.TypeA)
	m.Response = true
	m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a})
	b, err := m.Pack()
	require.NoError(t, err)
	return b
}

// query makes the endpoint's UDP connection to server port 53 from the
// endpoint's port local: the query passes (no proxy socket to steer to).
func (r *dnsRecRig) query(endpoint, server netip.Addr, local uint16) {
	r.t.Helper()
	q := udpFrame(netip.AddrPortFrom(endpoint, local), netip.AddrPortFrom(server, 53), make([]byte, 30))
	require.Equal(r.t, uint32(tcxNextRet), r.run(policy.Egress, q, 0), "the query passes")
}

func TestPrivilegedDNSAnswersRecorded(t *testing.T) {
	t.Parallel()
	r := newDNSRecRig(t)
	for _, f := range []struct {
		name             string
		endpoint, server netip.Addr
	}{{"IPv4", benchEndpoint, benchPeer}, {"IPv6", fragEndpoint6, fragPeer6}} {
		t.Run(f.name, func(t *testing.T) {
			r.t = t
			r.query(f.endpoint, f.server, dnsRecEndpointPort)
			payload := dnsAnswerFor(t, "www.example.com.", net.IPv4(192, 0, 2, 80))
			answer := udpFrame(netip.AddrPortFrom(f.server, 53), netip.AddrPortFrom(f.endpoint, dnsRecEndpointPort), payload)
			require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answer, 0x100), "the answer passes as a reply")
			got := r.records()
			require.Len(t, got, 1)
			a := got[0]
			family := uint8(1)
			if f.endpoint.Is6() {
				family = 2
			}
			require.Equal(t, family, a.Family)
			require.Equal(t, f.endpoint, a.Endpoint)
			require.Equal(t, f.server, a.Server)
			require.EqualValues(t, progRunIfindex, a.Ifindex)
			require.EqualValues(t, len(payload), a.Length)
			require.Equal(t, payload, a.Payload)
			require.False(t, a.Truncated())
			var m dns.Msg
			require.NoError(t, m.Unpack(a.Payload))
			require.Len(t, m.Answer, 1)
			require.Equal(t, "192.0.2.80", m.Answer[0].(*dns.A).A.String())
		})
	}
}

func TestPrivilegedDNSAnswersTruncated(t *testing.T) {
	t.Parallel()
	r := newDNSRecRig(t)
	r.query(benchEndpoint, benchPeer, dnsRecEndpointPort)
	payload := make([]byte, 1500)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	answer := udpFrame(netip.AddrPortFrom(benchPeer, 53), netip.AddrPortFrom(benchEndpoint, dnsRecEndpointPort), payload)
	require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answer, 0))
	got := r.records()
	require.Len(t, got, 1)
	require.EqualValues(t, 1500, got[0].Length, "the real length")
	require.Equal(t, payload[:bpfmaps.DNSAnswerPayloadMax], got[0].Payload, "the first bytes")
	require.True(t, got[0].Truncated())
}

// What is not recorded: no proxy configured, the proxy's own answer, a
// dropped packet, one policy passes that is no reply, TCP, a fragment.
func TestPrivilegedDNSAnswersNotRecorded(t *testing.T) {
	t.Parallel()
	r := newDNSRecRig(t)
	server := netip.AddrPortFrom(benchPeer, 53)
	answerTo := func(port uint16) []byte {
		return udpFrame(server, netip.AddrPortFrom(benchEndpoint, port), dnsAnswerFor(t, "a.example.", net.IPv4(192, 0, 2, 1)))
	}

	t.Run("no-proxy-port", func(t *testing.T) {
		r.t = t
		r.setPort(0)
		defer r.setPort(dnsRecProxyPort)
		r.query(benchEndpoint, benchPeer, 41001)
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answerTo(41001), 0))
		require.Empty(t, r.records())
	})
	t.Run("proxy-answer-mark", func(t *testing.T) {
		r.t = t
		r.query(benchEndpoint, benchPeer, 41002)
		for _, mark := range []uint32{dnsproxy.AnswerMark, 0x1000 | dnsproxy.AnswerMark} {
			require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answerTo(41002), mark))
		}
		require.Empty(t, r.records())
		// Another mark in the mask is no proxy's answer.
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answerTo(41002), 0x200))
		require.Len(t, r.records(), 1)
	})
	t.Run("dropped", func(t *testing.T) {
		r.t = t
		// No query from that port: no connection, no policy.
		require.Equal(t, uint32(tcxDropRet), r.run(policy.Ingress, answerTo(41003), 0))
		require.Empty(t, r.records())
	})
	t.Run("policy-not-reply", func(t *testing.T) {
		r.t = t
		putAllow(t, r.maps, testIdentityAllowed, policy.Ingress, testProtoUDP, 41004)
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answerTo(41004), 0), "allowed by policy")
		require.Empty(t, r.records(), "no query of the endpoint's asked for it")
	})
	t.Run("tcp", func(t *testing.T) {
		r.t = t
		const syn, ack = 0x02, 0x10
		ep := netip.AddrPortFrom(benchEndpoint, 41005)
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Egress, tcpPacket(ep, server, syn), 0))
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, tcpPacket(server, ep, syn|ack), 0), "a reply")
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Egress, tcpPacket(ep, server, ack), 0))
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, tcpPacket(server, ep, ack), 0), "a reply")
		require.Empty(t, r.records())
	})
	t.Run("fragment", func(t *testing.T) {
		r.t = t
		r.query(benchEndpoint, benchPeer, 41006)
		l4 := udpHeader(53, 41006, make([]byte, 64))
		// The first fragment of a larger datagram (more fragments, id 7).
		first := frame4x(benchPeer, benchEndpoint, testProtoUDP, nil, 0x2000, 7, l4)
		require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, first, 0), "passes as a reply")
		require.Empty(t, r.records())
	})
}

// A full ring: the answers it cannot take are counted, per CPU, in the
// pinned lost counter, and none is both recorded and counted.
func TestPrivilegedDNSAnswersLost(t *testing.T) {
	t.Parallel()
	r := newDNSRecRig(t)
	r.query(benchEndpoint, benchPeer, dnsRecEndpointPort)
	answer := udpFrame(netip.AddrPortFrom(benchPeer, 53), netip.AddrPortFrom(benchEndpoint, dnsRecEndpointPort), make([]byte, 100))
	const runs = bpfmaps.DNSAnswersRingBytes/bpfmaps.DNSAnswerRecordSize + 100
	runPerPacket(t, r.enf.toEndpoint, answer, runs, tcxNextRet)
	lost, err := bpfmaps.ReadDNSAnswersLost(r.maps.DNSAnswersLost)
	require.NoError(t, err)
	require.NotZero(t, lost)
	recorded := len(r.records())
	require.EqualValues(t, runs, uint64(recorded)+lost)
	// Read, the ring takes answers again.
	require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answer, 0))
	require.Len(t, r.records(), 1)
}

// The pinned ring keeps its records and its consumer position across
// readers and across closing and reopening the pin (an agent restart):
// a new reader reads what was written while nobody read, and not what
// the reader before it read.
func TestPrivilegedDNSAnswersPinnedAcrossReaders(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	dir := bpfmaps.PinDir(bpfRootOf(newTestLinksDir(t)))
	log := slog.New(slog.DiscardHandler)
	sizes := bpfmaps.Sizes{IPCache: 1024, Policy: 512, Conntrack: 4096, ConntrackOpening: 1024}
	pinned, err := bpfmaps.Open(dir, sizes, nil, log)
	require.NoError(t, err)
	maps := enforcerMaps{IPCache: pinned.IPCache, Policies: pinned.Policies, Policy: pinned.Policy, Enforcement: pinned.Enforcement,
		Counters: pinned.Counters, Endpoints: pinned.Endpoints, Conntrack: pinned.Conntrack, ConntrackOpening: pinned.ConntrackOpening,
		Revision: pinned.Revision, DNSProxy: pinned.DNSProxy, DNSAnswers: pinned.DNSAnswers, DNSAnswersLost: pinned.DNSAnswersLost}
	r := &dnsRecRig{t: t, maps: maps, enf: loadTestEnforcer(t, maps)}
	putIdentity(t, maps, netip.PrefixFrom(benchPeer, 32).String(), testIdentityAllowed)
	putAllow(t, maps, testIdentityAllowed, policy.Egress, testProtoUDP, 53)
	putEnforced(t, maps, policy.Egress, true)
	r.setPort(dnsRecProxyPort)
	r.query(benchEndpoint, benchPeer, dnsRecEndpointPort)
	answer := func(name string) []byte {
		return udpFrame(netip.AddrPortFrom(benchPeer, 53), netip.AddrPortFrom(benchEndpoint, dnsRecEndpointPort),
			dnsAnswerFor(t, name, net.IPv4(192, 0, 2, 1)))
	}
	names := func(recs []bpfmaps.DNSAnswerRecord) []string {
		var out []string
		for _, a := range recs {
			var m dns.Msg
			require.NoError(t, m.Unpack(a.Payload))
			out = append(out, m.Question[0].Name)
		}
		return out
	}

	reader, err := ringbuf.NewReader(pinned.DNSAnswers)
	require.NoError(t, err)
	require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answer("read.example."), 0))
	require.Equal(t, []string{"read.example."}, names(readDNSAnswers(t, reader)))
	require.NoError(t, reader.Close())

	// Nobody reads: the agent is down; then its maps are closed.
	require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answer("unread-1.example."), 0))
	require.Equal(t, uint32(tcxNextRet), r.run(policy.Ingress, answer("unread-2.example."), 0))
	require.NoError(t, pinned.Close())

	reopened, err := bpfmaps.Open(dir, sizes, nil, log)
	require.NoError(t, err)
	defer reopened.Close()
	reader, err = ringbuf.NewReader(reopened.DNSAnswers)
	require.NoError(t, err)
	defer reader.Close()
	require.Equal(t, []string{"unread-1.example.", "unread-2.example."}, names(readDNSAnswers(t, reader)))
}

// bpfmaps.DecodeDNSAnswer reads the program's struct dns_answer (its Go
// type generated from the object's BTF) field by field.
func TestDNSAnswerLayout(t *testing.T) {
	t.Parallel()
	in := bpf.EnforceDnsAnswer{Family: 2, Length: 1500, Ifindex: 7}
	endpoint, server := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::35")
	in.EndpointAddr, in.ServerAddr = endpoint.As16(), server.As16()
	for i := range in.Payload {
		in.Payload[i] = byte(i)
	}
	var buf bytes.Buffer
	require.NoError(t, binary.Write(&buf, binary.NativeEndian, &in))
	require.Equal(t, bpfmaps.DNSAnswerRecordSize, buf.Len())
	got, err := bpfmaps.DecodeDNSAnswer(buf.Bytes())
	require.NoError(t, err)
	require.Equal(t, bpfmaps.DNSAnswerRecord{Family: 2, Endpoint: endpoint, Server: server, Ifindex: 7, Length: 1500,
		Payload: in.Payload[:]}, got)

	in = bpf.EnforceDnsAnswer{Family: 1, Length: 3, Ifindex: 1, Payload: [1232]byte{9, 8, 7, 6}}
	copy(in.EndpointAddr[:], []byte{10, 0, 0, 1})
	copy(in.ServerAddr[:], []byte{10, 0, 0, 53})
	buf.Reset()
	require.NoError(t, binary.Write(&buf, binary.NativeEndian, &in))
	got, err = bpfmaps.DecodeDNSAnswer(buf.Bytes())
	require.NoError(t, err)
	require.Equal(t, bpfmaps.DNSAnswerRecord{Family: 1, Endpoint: netip.MustParseAddr("10.0.0.1"),
		Server: netip.MustParseAddr("10.0.0.53"), Ifindex: 1, Length: 3, Payload: []byte{9, 8, 7}}, got)
}
