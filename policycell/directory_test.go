// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

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
	require.EqualError(t, found.files["huge.yaml"].err, "policy file too large: more than the cap of 4194304 bytes (4 MiB)")

	// At the cap, a file is read.
	require.NoError(t, os.Truncate(filepath.Join(dir, "huge.yaml"), maxFileSize))
	found, err = readDirectory(dir)
	require.NoError(t, err)
	require.NoError(t, found.files["huge.yaml"].err)
	require.Len(t, found.files["huge.yaml"].content, maxFileSize)
}

// TestReadDirectoryTooLargeNotRead: what is read of a file far over the cap
// is bounded by the cap, not by the file.
func TestReadDirectoryTooLargeNotRead(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "huge.yaml"), nil, 0o644))
	require.NoError(t, os.Truncate(filepath.Join(dir, "huge.yaml"), 1<<30)) // sparse
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	found, err := readDirectory(dir)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.ErrorIs(t, found.files["huge.yaml"].err, ErrTooLarge)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(maxFileSize+1<<20), "allocated while reading a 1 GiB file")
}

// TestReadDirectoryAbsoluteLinkInside: an absolute symlink is outside the
// directory even when it points into it (the resolution must stay beneath
// the directory at every step, and an absolute path starts at /).
func TestReadDirectoryAbsoluteLinkInside(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, ".real", "a.yaml"), "a")
	require.NoError(t, os.Symlink(filepath.Join(dir, ".real", "a.yaml"), filepath.Join(dir, "a.yaml")))
	require.NoError(t, os.Symlink(".real/a.yaml", filepath.Join(dir, "relative.yaml")))
	found, err := readDirectory(dir)
	require.NoError(t, err)
	require.ErrorIs(t, found.files["a.yaml"].err, ErrOutsideDirectory)
	require.NoError(t, found.files["relative.yaml"].err)
	require.Equal(t, "a", string(found.files["relative.yaml"].content))
}

// TestReadDirectoryThroughLinkedDirectory: a symlinked directory is not
// traversed: neither listed into, nor a way out for a link that goes
// through it, nor read as a file when its name looks like one.
func TestReadDirectoryThroughLinkedDirectory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "policies")
	writeFile(t, filepath.Join(base, "outside", "secret.yaml"), "secret")
	writeFile(t, filepath.Join(dir, ".inside", "x.yaml"), "x")
	require.NoError(t, os.Symlink("../outside", filepath.Join(dir, "linked")))
	require.NoError(t, os.Symlink("linked/secret.yaml", filepath.Join(dir, "via.yaml")))
	require.NoError(t, os.Symlink("../outside", filepath.Join(dir, "outside.yaml")))
	require.NoError(t, os.Symlink(".inside", filepath.Join(dir, "inside.yaml")))

	found, err := readDirectory(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"outside.yaml", "via.yaml"}, slices.Sorted(maps.Keys(found.files)),
		"a link to a directory inside is ignored, its files are not read")
	for name, f := range found.files {
		require.ErrorIs(t, f.err, ErrOutsideDirectory, name)
		require.Nil(t, f.content, name)
	}
}

// TestReadDirectorySwappedFile: a policy file that keeps being swapped
// between a regular file and a symlink out of the directory (an attacker
// racing the reader between listing and reading) is never read through
// the link: the check is made by the kernel when the file is opened.
func TestReadDirectorySwappedFile(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "policies")
	secret := filepath.Join(base, "secret.yaml")
	writeFile(t, secret, "secret")
	writeFile(t, filepath.Join(dir, ".regular"), "inside")
	require.NoError(t, os.Symlink(secret, filepath.Join(dir, ".link")))

	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Hard links of the two, renamed over the policy file in turn.
			from := []string{".regular", ".link"}[i%2]
			tmp := filepath.Join(dir, ".swap")
			os.Remove(tmp)
			if err := os.Link(filepath.Join(dir, from), tmp); err == nil {
				os.Rename(tmp, filepath.Join(dir, "flip.yaml"))
			}
		}
	}()
	defer func() { close(stop); <-swapped }()

	reads := 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) || reads < 100; reads++ {
		found, err := readDirectory(dir)
		require.NoError(t, err)
		f, ok := found.files["flip.yaml"]
		if !ok {
			continue
		}
		require.NotEqual(t, "secret", string(f.content), "read %d: the file outside was read", reads)
		if f.err != nil {
			require.ErrorIs(t, f.err, ErrOutsideDirectory, "read %d", reads)
		}
	}
}
