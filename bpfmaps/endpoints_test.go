// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
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

	require.NoError(t, Cleanup(root))
	_, err = os.Stat(filepath.Join(dir, EndpointsName))
	require.ErrorIs(t, err, os.ErrNotExist)
}
