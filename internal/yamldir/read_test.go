// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"crypto/sha256"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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

// A read with a cache takes again a file unchanged since a read that
// found it settled (the same bytes, not read again), and reads a file
// again when it was rewritten (even to the same size), replaced by
// another file, or was changed too recently to be kept.
func TestReadCached(t *testing.T) {
	dir := t.TempDir()
	d := Dir{Path: dir, MaxSize: 1 << 20, What: "policy"}
	writeFile(t, filepath.Join(dir, "a.yaml"), "aaaa")
	writeFile(t, filepath.Join(dir, "b.yaml"), "bbbb")
	writeFile(t, filepath.Join(dir, "c.yaml"), "cccc")
	time.Sleep(100 * time.Millisecond)
	cache := &ReadCache{settle: 50 * time.Millisecond}
	first, err := d.ReadCached(cache)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256([]byte("aaaa")), first.Files["a.yaml"].Digest)

	writeFile(t, filepath.Join(dir, "b.yaml"), "BBBB")
	replaced := filepath.Join(t.TempDir(), "c.yaml")
	writeFile(t, replaced, "CCCC")
	info, err := os.Stat(filepath.Join(dir, "c.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.Chtimes(replaced, info.ModTime(), info.ModTime()))
	require.NoError(t, os.Rename(replaced, filepath.Join(dir, "c.yaml")))
	second, err := d.ReadCached(cache)
	require.NoError(t, err)
	require.Same(t, &first.Files["a.yaml"].Content[0], &second.Files["a.yaml"].Content[0], "unchanged: taken from the cache")
	require.Equal(t, first.Files["a.yaml"].Digest, second.Files["a.yaml"].Digest)
	require.Equal(t, "BBBB", string(second.Files["b.yaml"].Content), "rewritten to the same size")
	require.Equal(t, sha256.Sum256([]byte("BBBB")), second.Files["b.yaml"].Digest)
	require.Equal(t, "CCCC", string(second.Files["c.yaml"].Content), "replaced, with the same size and times")

	// b.yaml changed within the settle time of the second read: not kept,
	// read again however unchanged.
	third, err := d.ReadCached(cache)
	require.NoError(t, err)
	require.NotSame(t, &second.Files["b.yaml"].Content[0], &third.Files["b.yaml"].Content[0], "racy: read again")
	require.Same(t, &first.Files["a.yaml"].Content[0], &third.Files["a.yaml"].Content[0])

	// A removed file leaves the cache.
	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	_, err = d.ReadCached(cache)
	require.NoError(t, err)
	_, kept := cache.lookup("a.yaml")
	require.False(t, kept)
}

// Without settle time passed, nothing is kept: every read reads.
func TestReadCachedKeepsNothingRacy(t *testing.T) {
	dir := t.TempDir()
	d := Dir{Path: dir, MaxSize: 1 << 20, What: "policy"}
	writeFile(t, filepath.Join(dir, "a.yaml"), "aaaa")
	cache := &ReadCache{settle: time.Hour}
	first, err := d.ReadCached(cache)
	require.NoError(t, err)
	second, err := d.ReadCached(cache)
	require.NoError(t, err)
	require.NotSame(t, &first.Files["a.yaml"].Content[0], &second.Files["a.yaml"].Content[0])
	require.Equal(t, first.Files["a.yaml"].Digest, second.Files["a.yaml"].Digest)
}

// The cache keeps no content alive: once nothing else holds a file's
// content, the collector takes it, and the next read reads the file again.
func TestReadCacheKeepsNoContentAlive(t *testing.T) {
	dir := t.TempDir()
	d := Dir{Path: dir, MaxSize: 1 << 20, What: "policy"}
	content := strings.Repeat("a: b\n", 64)
	writeFile(t, filepath.Join(dir, "a.yaml"), content)
	time.Sleep(100 * time.Millisecond)
	cache := &ReadCache{settle: 50 * time.Millisecond}
	func() {
		l, err := d.ReadCached(cache)
		require.NoError(t, err)
		require.Equal(t, content, string(l.Files["a.yaml"].Content))
	}()
	runtime.GC()
	runtime.GC()
	c, ok := cache.lookup("a.yaml")
	require.True(t, ok, "the file's identity is kept")
	_, inMemory := c.content()
	require.False(t, inMemory, "its content is not")
	l, err := d.ReadCached(cache)
	require.NoError(t, err)
	require.Equal(t, content, string(l.Files["a.yaml"].Content), "read again")
	require.Equal(t, sha256.Sum256([]byte(content)), l.Files["a.yaml"].Digest)
}
