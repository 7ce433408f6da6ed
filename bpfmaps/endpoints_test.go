// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Open creates and pins the endpoints map, a restart reuses it with its
// entries, and Cleanup removes it.
func TestPrivilegedEndpointsMapPinned(t *testing.T) {
	privileged.Test(t)
	root := t.TempDir()
	_, err := EnsureBPFFS(root)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	dir := PinDir(root)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sizes := Sizes{IPCache: 16, Policy: 16, Conntrack: 16, ConntrackOpening: 16}

	maps, err := Open(dir, sizes, nil, log)
	require.NoError(t, err)
	require.NotNil(t, maps.Endpoints)
	require.Equal(t, EndpointsSpec().Type, maps.Endpoints.Type())
	require.Equal(t, uint32(EndpointsMaxEntries), maps.Endpoints.MaxEntries())
	k, v := NewEndpointKey(netip.MustParseAddr("10.0.0.1")), NewEndpointValue(300, 4)
	require.NoError(t, maps.Endpoints.Put(&k, &v))
	require.NoError(t, maps.Close())

	maps, err = Open(dir, sizes, nil, log)
	require.NoError(t, err)
	var got EndpointValue
	require.NoError(t, maps.Endpoints.Lookup(&k, &got), "kept across a restart")
	require.Equal(t, v, got)
	require.NoError(t, maps.Close())

	removed, err := Cleanup(root)
	require.NoError(t, err)
	require.Contains(t, removed.Maps, EndpointsName)
	require.Empty(t, removed.Links)
	_, err = os.Stat(filepath.Join(dir, EndpointsName))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// The outer policy map is reused across restarts with the default's map
// in it, which keeps its entries when its max entries change (a new map
// takes its place in the outer map), and AddPolicyOf and PolicyOf give a
// subject a map of its own.
func TestPrivilegedPoliciesReopened(t *testing.T) {
	privileged.Test(t)
	root := t.TempDir()
	_, err := EnsureBPFFS(root)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	dir := PinDir(root)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sizes := Sizes{IPCache: 16, Policy: 16, Conntrack: 16, ConntrackOpening: 16}

	maps, err := Open(dir, sizes, nil, log)
	require.NoError(t, err)
	require.Equal(t, ebpf.HashOfMaps, maps.Policies.Type())
	require.Equal(t, uint32(16), maps.Policy.MaxEntries())
	k, v := NewPolicyKey(policy.Key{Identity: 2, Direction: policy.Egress}), NewPolicyValue(1)
	require.NoError(t, maps.Policy.Put(&k, &v))
	sub, err := AddPolicyOf(maps.Policies, 300, 8)
	require.NoError(t, err)
	require.NoError(t, sub.Put(&k, &v))
	sub.Close()
	_, err = AddPolicyOf(maps.Policies, 300, 8)
	require.ErrorIs(t, err, ebpf.ErrKeyExist)
	require.NoError(t, maps.Close())

	sizes.Policy = 32
	maps, err = Open(dir, sizes, nil, log)
	require.NoError(t, err)
	defer maps.Close()
	require.Equal(t, uint32(32), maps.Policy.MaxEntries(), "migrated")
	got, err := ReadPolicy(root)
	require.NoError(t, err)
	require.Equal(t, map[PolicyKey]uint32{k: 1}, got, "the default's entries kept")
	sub, err = PolicyOf(maps.Policies, 300)
	require.NoError(t, err)
	defer sub.Close()
	var gotV PolicyValue
	require.NoError(t, sub.Lookup(&k, &gotV), "the subject's map kept")
	_, err = PolicyOf(maps.Policies, 301)
	require.ErrorIs(t, err, ebpf.ErrKeyNotExist)
}
