// SPDX-License-Identifier: Apache-2.0

package podcell_test

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/examples/embed/podcell"
	"github.com/ipcache-agent/ipcache-agent/identity"
)

func TestParse(t *testing.T) {
	pods, err := podcell.Parse("pods", `
# address      identity
10.244.1.5     1000
fd00:244::5    16777215   # the highest pod identity
	10.244.1.6	256
`)
	require.NoError(t, err)
	require.Equal(t, map[netip.Addr]identity.Number{
		netip.MustParseAddr("10.244.1.5"):  1000,
		netip.MustParseAddr("fd00:244::5"): 16777215,
		netip.MustParseAddr("10.244.1.6"):  256,
	}, pods)

	pods, err = podcell.Parse("pods", "# nothing\n\n")
	require.NoError(t, err)
	require.Empty(t, pods)
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		contents string
		want     string
	}{
		{"10.0.0.1 1000\n10.0.0.2\n", "pods:2: invalid pods file: want 'address identity', got 1 fields"},
		{"10.0.0.1 1000 web\n", "pods:1: invalid pods file: want 'address identity', got 3 fields"},
		{"10.0.0.1/32 1000\n", `pods:1: invalid pods file: address: ParseAddr("10.0.0.1/32"): unexpected character`},
		{"fe80::1%eth0 1000\n", "pods:1: invalid pods file: address fe80::1%eth0: zones are not allowed"},
		{"::ffff:10.0.0.1 1000\n", "pods:1: invalid pods file: address ::ffff:10.0.0.1: IPv4-mapped IPv6, write 10.0.0.1"},
		{"0.0.0.0 1000\n", "pods:1: invalid pods file: address 0.0.0.0: unspecified address"},
		{"10.0.0.1 2\n", `pods:1: invalid pods file: identity "2": want a number in 256..16777215`},
		{"10.0.0.1 16777217\n", `pods:1: invalid pods file: identity "16777217": want a number in 256..16777215`},
		{"10.0.0.1 -1\n", `pods:1: invalid pods file: identity "-1"`},
		{"10.0.0.1 web\n", `pods:1: invalid pods file: identity "web"`},
		{"10.0.0.1 1000\n\n10.0.0.1 1001\n", "pods:3: invalid pods file: address 10.0.0.1 is already on line 1"},
	} {
		t.Run(tc.contents, func(t *testing.T) {
			pods, err := podcell.Parse("pods", tc.contents)
			require.Nil(t, pods)
			require.ErrorIs(t, err, podcell.ErrInvalidPodsFile)
			require.ErrorContains(t, err, tc.want)
			var lineErr *podcell.LineError
			require.ErrorAs(t, err, &lineErr)
			require.Equal(t, "pods", lineErr.File)
		})
	}
}

func TestParseFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.txt")
	require.NoError(t, os.WriteFile(path, []byte("10.0.0.1 1000\n10.0.0.2 1\n"), 0o600))
	_, err := podcell.ParseFile(path)
	require.ErrorIs(t, err, podcell.ErrInvalidPodsFile)
	require.ErrorContains(t, err, path+":2: invalid pods file: identity \"1\"")

	_, err = podcell.ParseFile(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, "read pods file:")
	require.False(t, errors.Is(err, podcell.ErrInvalidPodsFile))
}
