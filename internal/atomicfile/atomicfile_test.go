// SPDX-License-Identifier: Apache-2.0

package atomicfile_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	require.NoError(t, atomicfile.Write(path, func(w io.Writer) error {
		_, err := io.WriteString(w, "one")
		return err
	}))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "one", string(data))
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// A failed write leaves the file as it was, and no temporary file.
	broken := errors.New("broken")
	err = atomicfile.Write(path, func(w io.Writer) error {
		io.WriteString(w, "half")
		return broken
	})
	require.ErrorIs(t, err, broken)
	require.ErrorContains(t, err, path)
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "one", string(data))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	stale := filepath.Join(dir, ".state.json.tmp-123")
	other := filepath.Join(dir, ".other.json.tmp-123")
	for _, name := range []string{path, stale, other} {
		require.NoError(t, os.WriteFile(name, []byte("x"), 0o600))
	}
	require.NoError(t, atomicfile.RemoveTemps(path))
	require.NoFileExists(t, stale)
	require.FileExists(t, other, "only path's temporary files")
	require.FileExists(t, path)
}
