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
	found, err := policyDir(link).Read()
	require.NoError(t, err)

	require.Equal(t, []string{"a.yaml", "absolute-escape.yaml", "b.yml", "cm.yaml", "dangling.yaml", "escape.yaml", "fifo.yaml"},
		slices.Sorted(maps.Keys(found.Files)))
	for name, want := range map[string]string{"a.yaml": "a", "b.yml": "b", "cm.yaml": "cm"} {
		require.NoError(t, found.Files[name].Err)
		require.Equal(t, want, string(found.Files[name].Content))
	}
	require.ErrorIs(t, found.Files["escape.yaml"].Err, ErrOutsideDirectory)
	require.ErrorIs(t, found.Files["absolute-escape.yaml"].Err, ErrOutsideDirectory)
	require.ErrorContains(t, found.Files["dangling.yaml"].Err, "resolve symlink")
	require.ErrorIs(t, found.Files["fifo.yaml"].Err, ErrNotRegular)

	real, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	require.Equal(t, []string{real, filepath.Join(real, "..2024_01")}, found.WatchDirs,
		"the directory and the directory of a symlink target are watched")
}

func TestReadDirectoryMissing(t *testing.T) {
	_, err := policyDir(filepath.Join(t.TempDir(), "missing")).Read()
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestReadDirectoryTooLarge(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "huge.yaml"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(maxFileSize+1))
	require.NoError(t, f.Close())
	found, err := policyDir(dir).Read()
	require.NoError(t, err)
	require.ErrorIs(t, found.Files["huge.yaml"].Err, ErrTooLarge)
	require.EqualError(t, found.Files["huge.yaml"].Err, "policy file too large: more than the cap of 4194304 bytes (4 MiB)")

	// At the cap, a file is read.
	require.NoError(t, os.Truncate(filepath.Join(dir, "huge.yaml"), maxFileSize))
	found, err = policyDir(dir).Read()
	require.NoError(t, err)
	require.NoError(t, found.Files["huge.yaml"].Err)
	require.Len(t, found.Files["huge.yaml"].Content, maxFileSize)
}

// TestReadDirectoryTooLargeNotRead: what is read of a file far over the cap
// is bounded by the cap, not by the file.
func TestReadDirectoryTooLargeNotRead(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "huge.yaml"), nil, 0o644))
	require.NoError(t, os.Truncate(filepath.Join(dir, "huge.yaml"), 1<<30)) // sparse
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	found, err := policyDir(dir).Read()
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.ErrorIs(t, found.Files["huge.yaml"].Err, ErrTooLarge)
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
	found, err := policyDir(dir).Read()
	require.NoError(t, err)
	require.ErrorIs(t, found.Files["a.yaml"].Err, ErrOutsideDirectory)
	require.NoError(t, found.Files["relative.yaml"].Err)
	require.Equal(t, "a", string(found.Files["relative.yaml"].Content))
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

	found, err := policyDir(dir).Read()
	require.NoError(t, err)
	require.Equal(t, []string{"outside.yaml", "via.yaml"}, slices.Sorted(maps.Keys(found.Files)),
		"a link to a directory inside is ignored, its files are not read")
	for name, f := range found.Files {
		require.ErrorIs(t, f.Err, ErrOutsideDirectory, name)
		require.Nil(t, f.Content, name)
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
		found, err := policyDir(dir).Read()
		require.NoError(t, err)
		f, ok := found.Files["flip.yaml"]
		if !ok {
			continue
		}
		require.NotEqual(t, "secret", string(f.Content), "read %d: the file outside was read", reads)
		if f.Err != nil {
			require.ErrorIs(t, f.Err, ErrOutsideDirectory, "read %d", reads)
		}
	}
}
