package datapathcell

import (
	"net/netip"
	"testing"
)

// FuzzIPCacheKey: any 24 bytes either decode to a prefix whose encoding is
// those very bytes, or are refused; never a panic.
func FuzzIPCacheKey(f *testing.F) {
	k := NewIPCacheKey(netip.MustParsePrefix("10.0.0.0/8"))
	f.Add(k[:])
	k6 := NewIPCacheKey(netip.MustParsePrefix("2001:db8::/32"))
	f.Add(k6[:])
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) != ipcacheKeySize {
			return
		}
		key := IPCacheKey(data)
		prefix, err := key.Prefix()
		if err != nil {
			return
		}
		if NewIPCacheKey(prefix) != key {
			t.Fatalf("key %x decodes to %s, which encodes to %x", data, prefix, NewIPCacheKey(prefix))
		}
	})
}

// FuzzPolicyKey: encoding the decoded fields gives the key back.
func FuzzPolicyKey(f *testing.F) {
	k := NewPolicyKey(16777217, DirectionEgress, 17, 53)
	f.Add(k[:])
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) != policyKeySize {
			return
		}
		key := PolicyKey(data)
		if NewPolicyKey(key.Fields()) != key {
			t.Fatalf("key %x does not round trip", data)
		}
	})
}
