// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// TestRead: only *.yaml and *.yml directly in the directory, not hidden;
// symlinks followed while they stay inside (a ConfigMap mount), errors of
// single files named with the directory's kind.
func TestRead(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "endpoints")
	writeFile(t, filepath.Join(dir, "a.yaml"), "a")
	writeFile(t, filepath.Join(dir, "b.yml"), "b")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "hidden")
	writeFile(t, filepath.Join(dir, "notes.txt"), "notes")
	writeFile(t, filepath.Join(dir, "sub", "c.yaml"), "in a subdirectory")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "dir.yaml"), 0o755))
	writeFile(t, filepath.Join(dir, "..2024_01", "cm.yaml"), "cm")
	require.NoError(t, os.Symlink("..2024_01", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink("..data/cm.yaml", filepath.Join(dir, "cm.yaml")))
	require.NoError(t, os.Symlink("sub", filepath.Join(dir, "linked-dir.yaml")))
	writeFile(t, filepath.Join(base, "outside.yaml"), "outside")
	require.NoError(t, os.Symlink("../outside.yaml", filepath.Join(dir, "escape.yaml")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644))
	writeFile(t, filepath.Join(dir, "large.yaml"), "0123456789")

	d := Dir{Path: dir, MaxSize: 9, What: "endpoint"}
	found, err := d.Read()
	require.NoError(t, err)
	require.Equal(t, []string{"a.yaml", "b.yml", "cm.yaml", "escape.yaml", "fifo.yaml", "large.yaml"},
		slices.Sorted(maps.Keys(found.Files)))
	for name, want := range map[string]string{"a.yaml": "a", "b.yml": "b", "cm.yaml": "cm"} {
		require.NoError(t, found.Files[name].Err)
		require.Equal(t, want, string(found.Files[name].Content))
	}
	require.ErrorIs(t, found.Files["escape.yaml"].Err, ErrOutsideDirectory)
	require.EqualError(t, found.Files["escape.yaml"].Err, "symlink target is outside the endpoint directory, not read: ../outside.yaml")
	require.ErrorIs(t, found.Files["fifo.yaml"].Err, ErrNotRegular)
	require.ErrorIs(t, found.Files["large.yaml"].Err, ErrTooLarge)
	require.EqualError(t, found.Files["large.yaml"].Err, "endpoint file too large: more than the cap of 9 bytes (0 MiB)")
	require.Equal(t, []string{dir, filepath.Join(dir, "..2024_01")}, found.WatchDirs)

	// At the cap exactly, a file is read.
	require.NoError(t, os.Truncate(filepath.Join(dir, "large.yaml"), 9))
	found, err = d.Read()
	require.NoError(t, err)
	require.Equal(t, "012345678", string(found.Files["large.yaml"].Content))

	_, err = Dir{Path: filepath.Join(base, "missing"), MaxSize: 9, What: "endpoint"}.Read()
	require.ErrorIs(t, err, os.ErrNotExist)
}
