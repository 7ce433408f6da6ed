// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// ReadEntries reads every entry, across several batches, of an LPM trie
// and of a hash map: the same as iterating key by key.
func TestPrivilegedReadEntriesInBatches(t *testing.T) {
	privileged.Test(t)
	const n = 2*readBatchSize + 17

	trie, err := ebpf.NewMap(IPCacheSpec(n))
	require.NoError(t, err)
	defer trie.Close()
	want := map[IPCacheKey]IPCacheValue{}
	for i := range n {
		k := NewIPCacheKey(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32-i%3))
		v := NewIPCacheValue(identity.Number(i))
		require.NoError(t, trie.Put(&k, &v))
		want[k] = v
	}
	got := map[IPCacheKey]IPCacheValue{}
	require.NoError(t, ReadEntries(trie, func(k IPCacheKey, v IPCacheValue) { got[k] = v }))
	require.Equal(t, want, got)

	hash, err := ebpf.NewMap(PolicySpec(n))
	require.NoError(t, err)
	defer hash.Close()
	wantPolicy := map[PolicyKey]PolicyValue{}
	for i := range n {
		k, v := policyMapKey(uint32(i), 0, 6, uint16(i)), NewPolicyValue(1)
		require.NoError(t, hash.Put(&k, &v))
		wantPolicy[k] = v
	}
	gotPolicy := map[PolicyKey]PolicyValue{}
	require.NoError(t, ReadEntries(hash, func(k PolicyKey, v PolicyValue) { gotPolicy[k] = v }))
	require.Equal(t, wantPolicy, gotPolicy)
}
