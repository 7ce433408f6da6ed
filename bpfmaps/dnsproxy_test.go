// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// Open creates and pins the dns-proxy map empty (no proxy), a restart
// reuses it with the port the previous agent wrote, and Cleanup removes
// it.
func TestPrivilegedDNSProxyMapPinned(t *testing.T) {
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
	require.NotNil(t, maps.DNSProxy)
	var got DNSProxyValue
	require.NoError(t, maps.DNSProxy.Lookup(uint32(0), &got))
	require.Zero(t, got.Port(), "a new map: no proxy")
	require.NoError(t, maps.DNSProxy.Put(uint32(0), NewDNSProxyValue(40053)))
	require.NoError(t, maps.Close())
	_, err = os.Stat(filepath.Join(dir, DNSProxyName))
	require.NoError(t, err, "pinned as %s", DNSProxyName)

	maps, err = Open(dir, sizes, nil, log)
	require.NoError(t, err)
	require.NoError(t, maps.DNSProxy.Lookup(uint32(0), &got))
	require.Equal(t, uint16(40053), got.Port(), "kept across a restart")
	require.NoError(t, maps.Close())

	removed, err := Cleanup(root)
	require.NoError(t, err)
	require.Contains(t, removed.Maps, DNSProxyName)
	_, err = os.Stat(filepath.Join(dir, DNSProxyName))
	require.ErrorIs(t, err, os.ErrNotExist)
}
