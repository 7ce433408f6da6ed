// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

func TestIPCacheKeyBytes(t *testing.T) {
	k := NewIPCacheKey(netip.MustParsePrefix("10.1.2.3/24"))
	require.Equal(t, IPCacheKey{
		56, 0, 0, 0, // prefixlen 32+24, little-endian
		0, 0, // cluster_id
		0,           // pad
		1,           // family IPv4
		10, 1, 2, 0, // address, host bits cleared
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	}, k)
	p, err := k.Prefix()
	require.NoError(t, err)
	require.Equal(t, netip.MustParsePrefix("10.1.2.0/24"), p)

	k6 := NewIPCacheKey(netip.MustParsePrefix("2001:db8::/32"))
	require.Equal(t, IPCacheKey{
		64, 0, 0, 0, 0, 0, 0, 2,
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	}, k6)
	p, err = k6.Prefix()
	require.NoError(t, err)
	require.Equal(t, netip.MustParsePrefix("2001:db8::/32"), p)
}

func TestIPCacheKeyRejectsNonCanonical(t *testing.T) {
	good := NewIPCacheKey(netip.MustParsePrefix("10.0.0.0/8"))
	for name, mutate := range map[string]func(*IPCacheKey){
		"cluster id":   func(k *IPCacheKey) { k[4] = 1 },
		"pad":          func(k *IPCacheKey) { k[6] = 1 },
		"family":       func(k *IPCacheKey) { k[7] = 9 },
		"host bits":    func(k *IPCacheKey) { k[11] = 1 },
		"length":       func(k *IPCacheKey) { k[0] = 200 },
		"v4 tail":      func(k *IPCacheKey) { k[20] = 1 },
		"short length": func(k *IPCacheKey) { k[0] = 3 },
	} {
		k := good
		mutate(&k)
		_, err := k.Prefix()
		require.Error(t, err, name)
	}
}

func TestIPCacheValueBytes(t *testing.T) {
	v := NewIPCacheValue(16777217)
	require.Equal(t, IPCacheValue{0x01, 0x00, 0x00, 0x01}, v)
	require.Equal(t, identity.Number(16777217), v.Identity())
}

func TestPolicyKeyValueBytes(t *testing.T) {
	k := policyMapKey(16777217, uint8(policy.Egress), 17, 53)
	require.Equal(t, PolicyKey{64, 0, 0, 0, 0x01, 0x00, 0x00, 0x01, 1, 17, 0x00, 0x35}, k, "dport in network order")
	id, dir, proto, port := k.Fields()
	require.Equal(t, []any{identity.Number(16777217), uint8(1), uint8(17), uint16(53)}, []any{id, dir, proto, port})
	require.Equal(t, PolicyValue{1, 0, 0, 0, 0, 0, 0, 0}, NewPolicyValue(uint32(policy.VerdictAllow)))
	require.Equal(t, uint32(policy.VerdictAllow), NewPolicyValue(uint32(policy.VerdictAllow)).Verdict())
	require.Equal(t, uint32(policy.VerdictDeny), NewPolicyValue(uint32(policy.VerdictDeny)).Verdict())
}

// TestPolicyKeyPrefix: the prefix length is PolicyPrefixLen, the bits past
// it are zero whatever the key holds there, and canonical keys decode
// back while others do not.
func TestPolicyKeyPrefix(t *testing.T) {
	for _, c := range []struct {
		key  policy.Key
		want PolicyKey
	}{
		{policy.Key{Identity: 2, Direction: policy.Egress, Protocol: 0, Port: 80},
			PolicyKey{40, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0}},
		{policy.Key{Identity: 0, Protocol: policy.ProtocolTCP, Port: 80, PortWildcardBits: 16},
			PolicyKey{48, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0}},
		{policy.Key{Protocol: policy.ProtocolTCP, Port: 8003, PortWildcardBits: 3}, // 8000-8007
			PolicyKey{61, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0x1f, 0x40}},
		{policy.Key{Protocol: policy.ProtocolICMP, Port: 8<<8 | 3, PortWildcardBits: 8}, // type 8
			PolicyKey{56, 0, 0, 0, 0, 0, 0, 0, 0, 1, 8, 0}},
	} {
		k := NewPolicyKey(c.key)
		require.Equal(t, c.want, k, "%+v", c.key)
		decoded, err := k.Key()
		require.NoError(t, err)
		require.Equal(t, k, NewPolicyKey(decoded))
		require.Equal(t, c.key.PortWildcardBits, decoded.PortWildcardBits)
	}
	for name, k := range map[string]PolicyKey{
		"protocol past 40":   {40, 0, 0, 0, 2, 0, 0, 0, 1, 6, 0, 0},
		"port bits past 61":  {61, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0x1f, 0x41},
		"prefix 44":          {44, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0},
		"prefix 65":          {65, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0},
		"protocol 0 past 48": {48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		_, err := k.Key()
		require.Error(t, err, name)
	}
}

// policyMapKey is the map key of a rule as the previous layout wrote it:
// protocol 0 any protocol, port 0 every port of the protocol.
func policyMapKey(identity uint32, direction, protocol uint8, port uint16) PolicyKey {
	return NewPolicyKey(hashPolicyKey(identity, direction, protocol, port))
}

func TestEndpointKeyBytes(t *testing.T) {
	k := NewEndpointKey(netip.MustParseAddr("10.1.2.3"))
	require.Equal(t, EndpointKey{
		1, 0, 0, 0, // family IPv4, pad
		10, 1, 2, 3,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	}, k)
	require.Equal(t, k, NewEndpointKey(netip.MustParseAddr("::ffff:10.1.2.3")), "a mapped address is IPv4")
	addr, err := k.Addr()
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("10.1.2.3"), addr)

	k6 := NewEndpointKey(netip.MustParseAddr("2001:db8::1"))
	require.Equal(t, EndpointKey{
		2, 0, 0, 0,
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
	}, k6)
	addr, err = k6.Addr()
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("2001:db8::1"), addr)

	for name, mutate := range map[string]func(*EndpointKey){
		"pad":     func(k *EndpointKey) { k[2] = 1 },
		"family":  func(k *EndpointKey) { k[0] = 9 },
		"v4 tail": func(k *EndpointKey) { k[19] = 1 },
	} {
		bad := k
		mutate(&bad)
		_, err := bad.Addr()
		require.Error(t, err, name)
	}
}

func TestEndpointValueBytes(t *testing.T) {
	v := NewEndpointValue(0x1234, 7)
	require.Equal(t, EndpointValue{0x34, 0x12, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0}, v)
	require.Equal(t, identity.Number(0x1234), v.Identity())
	require.Equal(t, uint32(7), v.Ifindex())
	require.Equal(t, uint32(0), v.Flags())
}

func TestEnforcementKeyBytes(t *testing.T) {
	k := NewEnforcementKey(300, policy.Egress)
	var b bytes.Buffer
	require.NoError(t, binary.Write(&b, binary.LittleEndian, k))
	require.Equal(t, []byte{0x59, 0x02, 0, 0}, b.Bytes(), "300*2 + 1")
	require.Equal(t, identity.Number(300), k.Subject())
	require.Equal(t, policy.Egress, k.Direction())
	require.Equal(t, EnforcementKey(1), NewEnforcementKey(0, policy.Egress), "the default's where the previous array had them")
	require.Less(t, uint32(NewEnforcementKey(identity.MaxCluster, policy.Egress)), EnforcementSpec().MaxEntries)
}

// Every subject the outer policy map can hold: 0 and the label identities.
func TestPolicySubjectsCoverTheLabelIdentities(t *testing.T) {
	require.Greater(t, PolicySubjects, uint32(identity.MaxCluster))
	require.Equal(t, uint32(EndpointsMaxEntries), EndpointsSpec().MaxEntries)
	require.Equal(t, PolicySubjects, PoliciesSpec(10).MaxEntries)
	require.Equal(t, PolicySpec(10), PoliciesSpec(10).InnerMap)
}

func TestDNSProxyValueBytes(t *testing.T) {
	require.Equal(t, DNSProxyValue{0xe9, 0x14, 0, 0}, NewDNSProxyValue(5353), "u32, little-endian")
	require.Equal(t, uint16(5353), NewDNSProxyValue(5353).Port())
	require.Equal(t, DNSProxyValue{}, NewDNSProxyValue(0), "no proxy")
	require.Zero(t, DNSProxyValue{0, 0, 1, 0}.Port(), "above 65535: no proxy, as the program takes it")
	spec := DNSProxySpec()
	require.Equal(t, "dns-proxy", spec.Name)
	require.Equal(t, ebpf.Array, spec.Type)
	require.EqualValues(t, 4, spec.KeySize)
	require.EqualValues(t, 4, spec.ValueSize)
	require.EqualValues(t, 1, spec.MaxEntries)
	require.Zero(t, spec.Flags)
}
