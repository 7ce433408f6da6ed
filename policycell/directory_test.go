package policycell

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

func TestReadDirectory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "policies")
	writeFile(t, filepath.Join(dir, "a.yaml"), "a")
	writeFile(t, filepath.Join(dir, "b.yml"), "b")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "hidden")
	writeFile(t, filepath.Join(dir, "notes.txt"), "notes")
	writeFile(t, filepath.Join(dir, "a.yaml.swp"), "swap")
	writeFile(t, filepath.Join(dir, "sub", "c.yaml"), "in a subdirectory")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "dir.yaml"), 0o755))
	// A ConfigMap mount: cm.yaml -> ..data/cm.yaml, ..data -> ..2024_01.
	writeFile(t, filepath.Join(dir, "..2024_01", "cm.yaml"), "cm")
	require.NoError(t, os.Symlink("..2024_01", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink("..data/cm.yaml", filepath.Join(dir, "cm.yaml")))
	// Links to a directory, out of the directory, and to nothing.
	require.NoError(t, os.Symlink("sub", filepath.Join(dir, "linked-dir.yaml")))
	writeFile(t, filepath.Join(base, "outside.yaml"), "outside")
	require.NoError(t, os.Symlink("../outside.yaml", filepath.Join(dir, "escape.yaml")))
	require.NoError(t, os.Symlink(filepath.Join(base, "outside.yaml"), filepath.Join(dir, "absolute-escape.yaml")))
	require.NoError(t, os.Symlink("missing.yaml", filepath.Join(dir, "dangling.yaml")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644))

	// The policy directory itself may be a symlink.
	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink("policies", link))
	found, err := readDirectory(link)
	require.NoError(t, err)

	require.Equal(t, []string{"a.yaml", "absolute-escape.yaml", "b.yml", "cm.yaml", "dangling.yaml", "escape.yaml", "fifo.yaml"},
		slices.Sorted(maps.Keys(found.files)))
	for name, want := range map[string]string{"a.yaml": "a", "b.yml": "b", "cm.yaml": "cm"} {
		require.NoError(t, found.files[name].err)
		require.Equal(t, want, string(found.files[name].content))
	}
	require.ErrorIs(t, found.files["escape.yaml"].err, ErrOutsideDirectory)
	require.ErrorIs(t, found.files["absolute-escape.yaml"].err, ErrOutsideDirectory)
	require.ErrorContains(t, found.files["dangling.yaml"].err, "resolve symlink")
	require.ErrorIs(t, found.files["fifo.yaml"].err, ErrNotRegular)

	real, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	require.Equal(t, []string{real, filepath.Join(real, "..2024_01")}, found.watchDirs,
		"the directory and the directory of a symlink target are watched")
}

func TestReadDirectoryMissing(t *testing.T) {
	_, err := readDirectory(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestReadDirectoryTooLarge(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "huge.yaml"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(maxFileSize+1))
	require.NoError(t, f.Close())
	found, err := readDirectory(dir)
	require.NoError(t, err)
	require.ErrorIs(t, found.files["huge.yaml"].err, ErrTooLarge)
}
