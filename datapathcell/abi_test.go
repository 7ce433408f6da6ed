// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"github.com/ipcache-agent/ipcache-agent/policy"

	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIPCacheKeyBytes(t *testing.T) {
	k := NewIPCacheMapKey(netip.MustParsePrefix("10.1.2.3/24"))
	require.Equal(t, IPCacheMapKey{
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

	k6 := NewIPCacheMapKey(netip.MustParsePrefix("2001:db8::/32"))
	require.Equal(t, IPCacheMapKey{
		64, 0, 0, 0, 0, 0, 0, 2,
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	}, k6)
	p, err = k6.Prefix()
	require.NoError(t, err)
	require.Equal(t, netip.MustParsePrefix("2001:db8::/32"), p)
}

func TestIPCacheKeyRejectsNonCanonical(t *testing.T) {
	good := NewIPCacheMapKey(netip.MustParsePrefix("10.0.0.0/8"))
	for name, mutate := range map[string]func(*IPCacheMapKey){
		"cluster id":   func(k *IPCacheMapKey) { k[4] = 1 },
		"pad":          func(k *IPCacheMapKey) { k[6] = 1 },
		"family":       func(k *IPCacheMapKey) { k[7] = 9 },
		"host bits":    func(k *IPCacheMapKey) { k[11] = 1 },
		"length":       func(k *IPCacheMapKey) { k[0] = 200 },
		"v4 tail":      func(k *IPCacheMapKey) { k[20] = 1 },
		"short length": func(k *IPCacheMapKey) { k[0] = 3 },
	} {
		k := good
		mutate(&k)
		_, err := k.Prefix()
		require.Error(t, err, name)
	}
}

func TestIPCacheValueBytes(t *testing.T) {
	v := NewIPCacheMapValue(16777217)
	require.Equal(t, IPCacheMapValue{0x01, 0x00, 0x00, 0x01}, v)
	require.Equal(t, uint32(16777217), v.Identity())
}

func TestPolicyKeyValueBytes(t *testing.T) {
	k := policyMapKey(16777217, uint8(policy.Egress), 17, 53)
	require.Equal(t, PolicyMapKey{64, 0, 0, 0, 0x01, 0x00, 0x00, 0x01, 1, 17, 0x00, 0x35}, k, "dport in network order")
	id, dir, proto, port := k.Fields()
	require.Equal(t, []any{uint32(16777217), uint8(1), uint8(17), uint16(53)}, []any{id, dir, proto, port})
	require.Equal(t, PolicyMapValue{1, 0, 0, 0, 0, 0, 0, 0}, NewPolicyMapValue(uint32(policy.VerdictAllow)))
	require.Equal(t, uint32(policy.VerdictAllow), NewPolicyMapValue(uint32(policy.VerdictAllow)).Verdict())
	require.Equal(t, uint32(policy.VerdictDeny), NewPolicyMapValue(uint32(policy.VerdictDeny)).Verdict())
}

// TestPolicyKeyPrefix: the prefix length is mapPrefixLen, the bits past
// it are zero whatever the key holds there, and canonical keys decode
// back while others do not.
func TestPolicyKeyPrefix(t *testing.T) {
	for _, c := range []struct {
		key  policy.Key
		want PolicyMapKey
	}{
		{policy.Key{Identity: 2, Direction: policy.Egress, Protocol: 0, Port: 80},
			PolicyMapKey{40, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0}},
		{policy.Key{Identity: 0, Protocol: policy.ProtocolTCP, Port: 80, PortWildcardBits: 16},
			PolicyMapKey{48, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0}},
		{policy.Key{Protocol: policy.ProtocolTCP, Port: 8003, PortWildcardBits: 3}, // 8000-8007
			PolicyMapKey{61, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0x1f, 0x40}},
		{policy.Key{Protocol: policy.ProtocolICMP, Port: 8<<8 | 3, PortWildcardBits: 8}, // type 8
			PolicyMapKey{56, 0, 0, 0, 0, 0, 0, 0, 0, 1, 8, 0}},
	} {
		k := NewPolicyMapKey(c.key)
		require.Equal(t, c.want, k, "%+v", c.key)
		decoded, err := k.PolicyKey()
		require.NoError(t, err)
		require.Equal(t, k, NewPolicyMapKey(decoded))
		require.Equal(t, c.key.PortWildcardBits, decoded.PortWildcardBits)
	}
	for name, k := range map[string]PolicyMapKey{
		"protocol past 40":   {40, 0, 0, 0, 2, 0, 0, 0, 1, 6, 0, 0},
		"port bits past 61":  {61, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0x1f, 0x41},
		"prefix 44":          {44, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0},
		"prefix 65":          {65, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0},
		"protocol 0 past 48": {48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		_, err := k.PolicyKey()
		require.Error(t, err, name)
	}
}

// policyMapKey is the map key of a rule as the previous layout wrote it:
// protocol 0 any protocol, port 0 every port of the protocol.
func policyMapKey(identity uint32, direction, protocol uint8, port uint16) PolicyMapKey {
	return NewPolicyMapKey(hashPolicyKey(identity, direction, protocol, port))
}
