package datapathcell

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
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
	require.Equal(t, uint32(16777217), v.Identity())
}

func TestPolicyKeyValueBytes(t *testing.T) {
	k := NewPolicyKey(16777217, DirectionEgress, 17, 53)
	require.Equal(t, PolicyKey{0x01, 0x00, 0x00, 0x01, 1, 17, 0x00, 0x35}, k, "dport in network order")
	id, dir, proto, port := k.Fields()
	require.Equal(t, []any{uint32(16777217), uint8(1), uint8(17), uint16(53)}, []any{id, dir, proto, port})
	require.Equal(t, PolicyValue{1, 0, 0, 0, 0, 0, 0, 0}, NewPolicyValue(VerdictAllow))
	require.Equal(t, uint32(VerdictAllow), NewPolicyValue(VerdictAllow).Verdict())
}
