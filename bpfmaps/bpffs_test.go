// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// The tests run in the host's mount namespace (cmd/ipcache-agent's tests
// run the agent in one of its own): there is a reference namespace, and
// it is this process's.
func TestHostMountNamespaceIsTheTestsOwn(t *testing.T) {
	own, host, private := privateMountNamespace()
	require.NotEmpty(t, own)
	require.Equal(t, own, host.namespace, "pid %d", host.pid)
	require.False(t, private)
}

func TestUnder(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/sys/fs/bpf", true},
		{"/sys", true},
		{"/sys/", true},
		{"/sysfoo/bpf", false},
		{"/run/bpf", false},
		{"/sys/../run/bpf", false},
	} {
		require.Equal(t, tc.want, under(tc.path, "/sys"), tc.path)
	}
}

// TestPrivilegedEnsureBPFFS: a missing root is made and mounted, once; a
// root already bpffs is left as it is.
func TestPrivilegedEnsureBPFFS(t *testing.T) {
	privileged.Test(t)
	root := filepath.Join(t.TempDir(), "not", "yet")
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	bpffs, err := IsBPFFS(root)
	require.NoError(t, err)
	require.False(t, bpffs, "a path that does not exist")
	mounted, err := EnsureBPFFS(root)
	require.NoError(t, err)
	require.True(t, mounted)
	bpffs, err = IsBPFFS(root)
	require.NoError(t, err)
	require.True(t, bpffs)
	mounted, err = EnsureBPFFS(root)
	require.NoError(t, err)
	require.False(t, mounted, "already bpffs")
	bpffs, err = IsBPFFS(filepath.Dir(root))
	require.NoError(t, err)
	require.False(t, bpffs)
	_, err = os.Stat(root)
	require.NoError(t, err)
}
