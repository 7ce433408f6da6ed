// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policycell"
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
	k := NewPolicyMapKey(16777217, uint8(policycell.Egress), 17, 53)
	require.Equal(t, PolicyMapKey{0x01, 0x00, 0x00, 0x01, 1, 17, 0x00, 0x35}, k, "dport in network order")
	id, dir, proto, port := k.Fields()
	require.Equal(t, []any{uint32(16777217), uint8(1), uint8(17), uint16(53)}, []any{id, dir, proto, port})
	require.Equal(t, PolicyMapValue{1, 0, 0, 0, 0, 0, 0, 0}, NewPolicyMapValue(uint32(policycell.VerdictAllow)))
	require.Equal(t, uint32(policycell.VerdictAllow), NewPolicyMapValue(uint32(policycell.VerdictAllow)).Verdict())
}
