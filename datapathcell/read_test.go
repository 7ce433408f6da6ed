// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// readEntries reads every entry, across several batches, of an LPM trie
// and of a hash map: the same as iterating key by key.
func TestPrivilegedReadEntriesInBatches(t *testing.T) {
	privileged.Test(t)
	const n = 2*readBatchSize + 17

	trie, err := ebpf.NewMap(IPCacheMapSpec(n))
	require.NoError(t, err)
	defer trie.Close()
	want := map[IPCacheMapKey]IPCacheMapValue{}
	for i := range n {
		k := NewIPCacheMapKey(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32-i%3))
		v := NewIPCacheMapValue(uint32(i))
		require.NoError(t, trie.Put(&k, &v))
		want[k] = v
	}
	got := map[IPCacheMapKey]IPCacheMapValue{}
	require.NoError(t, readEntries(trie, func(k IPCacheMapKey, v IPCacheMapValue) { got[k] = v }))
	require.Equal(t, want, got)

	hash, err := ebpf.NewMap(policyMapSpec(n))
	require.NoError(t, err)
	defer hash.Close()
	wantPolicy := map[PolicyMapKey]PolicyMapValue{}
	for i := range n {
		k, v := policyMapKey(uint32(i), 0, 6, uint16(i)), NewPolicyMapValue(1)
		require.NoError(t, hash.Put(&k, &v))
		wantPolicy[k] = v
	}
	gotPolicy := map[PolicyMapKey]PolicyMapValue{}
	require.NoError(t, readEntries(hash, func(k PolicyMapKey, v PolicyMapValue) { gotPolicy[k] = v }))
	require.Equal(t, wantPolicy, gotPolicy)
}
