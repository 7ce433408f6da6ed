// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
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

// FuzzIPCacheValue: any 24 bytes read from a pinned map decode to the
// sec_identity of the layout (little-endian u32 at offset 0), never a
// panic; an identity encodes to a value with everything else zero (no
// tunnel endpoint, key or flags) that decodes to it again.
func FuzzIPCacheValue(f *testing.F) {
	v := NewIPCacheValue(16777217)
	f.Add(v[:])
	var tunneled IPCacheValue
	for i := range tunneled {
		tunneled[i] = byte(i + 1)
	}
	f.Add(tunneled[:])
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) != ipcacheValueSize {
			return
		}
		value := IPCacheValue(data)
		id := value.Identity()
		if want := identity.Number(binary.LittleEndian.Uint32(data[0:4])); id != want {
			t.Fatalf("value %x: identity %d, want %d (little-endian u32 at 0)", data, id, want)
		}
		encoded := NewIPCacheValue(id)
		if encoded.Identity() != id || !bytes.Equal(encoded[4:], make([]byte, ipcacheValueSize-4)) {
			t.Fatalf("identity %d encodes to %x", id, encoded)
		}
		if rest := bytes.Equal(data[4:], make([]byte, ipcacheValueSize-4)); rest != (encoded == value) {
			t.Fatalf("value %x: encoding its identity gives %x", data, encoded)
		}
	})
}

// FuzzPolicyKey: a key that decodes encodes back to itself (so only
// canonical keys decode), the fields sit where the layout says
// (prefixlen and identity little-endian at 0 and 4, direction at 8,
// protocol at 9, dport big-endian at 10), and the prefix length is the
// decoded key's.
func FuzzPolicyKey(f *testing.F) {
	for _, k := range []PolicyKey{
		policyMapKey(16777217, uint8(policy.Egress), 17, 53),
		policyMapKey(16777217, uint8(policy.Egress), 6, 0),
		policyMapKey(2, uint8(policy.Ingress), 0, 0),
		NewPolicyKey(policy.Key{Protocol: policy.ProtocolTCP, Port: 8000, PortWildcardBits: 3}),
	} {
		f.Add(k[:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) != policyKeySize {
			return
		}
		key := PolicyKey(data)
		id, dir, proto, dport := key.Fields()
		if id != identity.Number(binary.LittleEndian.Uint32(data[4:8])) || dir != data[8] || proto != data[9] ||
			dport != binary.BigEndian.Uint16(data[10:12]) {
			t.Fatalf("key %x decodes to %d/%d/%d/%d, not the layout's fields", data, id, dir, proto, dport)
		}
		decoded, err := key.Key()
		if err != nil {
			return
		}
		if NewPolicyKey(decoded) != key {
			t.Fatalf("key %x does not round trip", data)
		}
		if PolicyPrefixLen(decoded) != binary.LittleEndian.Uint32(data[0:4]) {
			t.Fatalf("key %x decodes to prefix length %d", data, PolicyPrefixLen(decoded))
		}
	})
}

// FuzzPolicyValue: any 8 bytes decode to the verdict of the layout
// (little-endian u32 at 0; the pad is ignored), and a verdict encodes to a
// value with a zero pad that decodes to it again.
func FuzzPolicyValue(f *testing.F) {
	v := NewPolicyValue(uint32(policy.VerdictAllow))
	f.Add(v[:])
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) != policyValueSize {
			return
		}
		value := PolicyValue(data)
		verdict := value.Verdict()
		if want := binary.LittleEndian.Uint32(data[0:4]); verdict != want {
			t.Fatalf("value %x: verdict %d, want %d", data, verdict, want)
		}
		encoded := NewPolicyValue(verdict)
		if encoded.Verdict() != verdict || !bytes.Equal(encoded[4:], []byte{0, 0, 0, 0}) {
			t.Fatalf("verdict %d encodes to %x", verdict, encoded)
		}
		if zeroPad := bytes.Equal(data[4:], []byte{0, 0, 0, 0}); zeroPad != (encoded == value) {
			t.Fatalf("value %x: encoding its verdict gives %x", data, encoded)
		}
	})
}
