// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"
	"weak"

	"golang.org/x/sys/unix"
)

// Dir is a directory of YAML files, and how its files are read.
type Dir struct {
	// Path is the directory, as configured (it may be a symlink).
	Path string
	// MaxSize caps a file: a larger one is an error of that file
	// (ErrTooLarge), read no further.
	MaxSize int
	// What names the files in messages: "policy" gives "policy file too
	// large" and "Cannot read the policy directory".
	What string
}

// Listing is what one read of the directory found.
type Listing struct {
	// Files are the YAML files by name: their content, or why it could not
	// be read.
	Files map[string]File

	// WatchDirs are the directories whose changes can change the files:
	// the directory (its symlinks resolved) and those holding symlink
	// targets.
	WatchDirs []string
}

// File is one file of a Listing: its content and the content's sha256
// digest, or why it could not be read.
type File struct {
	Content []byte
	Digest  [sha256.Size]byte
	Err     error
}

// ReadCache keeps, of each file a read took, the digest of the content
// read, a weak pointer to that content, and what identifies the content
// on disk: the opened file's device, inode, size, and change and
// modification times. A read with the cache takes a file whose identity
// is the one kept, and whose content is still in memory, without reading
// or hashing it again: an edit of one file of a large directory read and
// hashed every file again, most of what the edit cost (docs/SCALE.md).
// The cache keeps no content alive: what Versions drops (a content that
// does not parse) the collector may take, and the next read reads it.
//
// A file changed less than racyWindow before the read that took it is
// not kept: a later write within the file system's timestamp granularity
// could leave its times as they were (git's "racily clean" files). A file
// kept had its times settled when it was read, so any later write gives
// it a later change time. The zero value is ready; it is not safe for
// concurrent use.
type ReadCache struct {
	files map[string]cachedFile
	// settle is how long after its last change a file read is kept; zero:
	// racyWindow.
	settle time.Duration
}

type cachedFile struct {
	stamp  fileStamp
	first  weak.Pointer[byte] // the content's first byte
	digest [sha256.Size]byte
}

// content returns the content, if it is still in memory.
func (c cachedFile) content() ([]byte, bool) {
	first := c.first.Value()
	if first == nil {
		return nil, false
	}
	return unsafe.Slice(first, c.stamp.size), true
}

// fileStamp identifies a file's content on disk.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

// racyWindow is how long after a file's last change a read must come for
// the read cache to keep it. Local file systems stamp a write with the
// kernel's coarse clock, which moves once a tick (at most 10 ms apart):
// ten ticks. Files are mostly written well before the agent reads them
// (a policy directory written before the agent starts is read a few
// hundred milliseconds later), and a file within the window is only read
// again.
const racyWindow = 100 * time.Millisecond

// stampOf returns the identity of an opened file's content.
func stampOf(f *os.File) (fileStamp, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileStamp{}, false
	}
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, true
}

// IsYAMLFile reports whether a directory entry's name makes it a file of
// the directory: *.yaml or *.yml, not hidden (which also skips Kubernetes'
// "..data" and its timestamped directories, and editors' swap files).
func IsYAMLFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// Read reads the YAML files directly in the directory. Subdirectories
// (and symlinks to directories) are ignored, never traversed. Symlinks
// are followed, so that Kubernetes ConfigMap mounts work, but only while
// they stay inside the directory (after resolving its own symlinks): every
// file is opened relative to the directory with openat2(RESOLVE_BENEATH),
// so the kernel refuses, at the moment of opening, a resolution that
// leaves the directory (a relative target out of it, an absolute target, a
// symlinked directory out of it). The file type is checked on the opened
// file (fstat), so swapping a file for a link or a FIFO between the
// listing and the read is no way around either check. A link out of the
// directory is an error of that file (ErrOutsideDirectory) and is not
// opened.
//
// Possible errors: the directory cannot be resolved, opened or listed;
// openat2 is not available (Linux before 5.6). Errors of single files
// (ErrOutsideDirectory, ErrNotRegular, ErrTooLarge, the system's) are in
// the listing.
func (d Dir) Read() (Listing, error) {
	return d.ReadCached(nil)
}

// ReadCached is Read, taking from cache the files it holds whose content
// has not changed since (see ReadCache), and keeping in it the files read
// for the next read. A nil cache: every file is read.
//
// Possible errors: those of Read.
func (d Dir) ReadCached(cache *ReadCache) (Listing, error) {
	readAt := time.Now()
	root, err := filepath.EvalSymlinks(d.Path)
	if err != nil {
		return Listing{}, err
	}
	if root, err = filepath.Abs(root); err != nil {
		return Listing{}, err
	}
	dir, err := os.Open(root)
	if err != nil {
		return Listing{}, err
	}
	defer dir.Close()
	entries, err := dir.ReadDir(-1)
	if err != nil {
		return Listing{}, err
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	raw, err := dir.SyscallConn()
	if err != nil {
		return Listing{}, err
	}

	found := Listing{Files: map[string]File{}, WatchDirs: []string{root}}
	var kept map[string]cachedFile
	if cache != nil {
		kept = map[string]cachedFile{}
		defer func() { cache.files = kept }()
	}
	for _, entry := range entries {
		name := entry.Name()
		if !IsYAMLFile(name) || entry.IsDir() {
			continue
		}
		path := filepath.Join(root, name)
		isLink := entry.Type()&fs.ModeSymlink != 0
		if !isLink && !entry.Type().IsRegular() {
			// Known not to be a file without opening it (opening a
			// device can have effects); the fstat below is what counts.
			found.Files[name] = File{Err: fmt.Errorf("%w: %s", ErrNotRegular, entry.Type().Type())}
			continue
		}
		var f *os.File
		var openErr error
		if err := raw.Control(func(dirfd uintptr) { f, openErr = openBeneath(int(dirfd), root, name) }); err != nil {
			return Listing{}, err
		}
		switch {
		case errors.Is(openErr, unix.ENOSYS):
			return Listing{}, fmt.Errorf("open %s: openat2 is not available (Linux 5.6 or later is needed): %w", path, openErr)
		case errors.Is(openErr, unix.EXDEV):
			target, _ := os.Readlink(path)
			found.Files[name] = File{Err: fmt.Errorf("%w: %s", d.errOutside(), target)}
			continue
		case openErr != nil && isLink:
			found.Files[name] = File{Err: fmt.Errorf("resolve symlink: %w", openErr)}
			continue
		case errors.Is(openErr, fs.ErrNotExist):
			continue // removed since the listing: the next read sees the removal
		case openErr != nil:
			found.Files[name] = File{Err: openErr}
			continue
		}
		read, isDir := d.readFile(f, name, cache, kept, readAt)
		f.Close()
		if isDir {
			continue
		}
		found.Files[name] = read
		if isLink && read.Err == nil {
			// What to watch, not what to read: the content is what was
			// read above, whatever the link points at by now.
			if target, err := filepath.EvalSymlinks(path); err == nil && isInside(root, target) {
				found.WatchDirs = append(found.WatchDirs, filepath.Dir(target))
			}
		}
	}
	slices.Sort(found.WatchDirs)
	found.WatchDirs = slices.Compact(found.WatchDirs)
	return found, nil
}

// readFile reads an opened file of the directory, or takes it from cache
// when its content has not changed since (see ReadCache), and puts it in
// kept (unless nil) when it may be taken from there at the next read.
func (d Dir) readFile(f *os.File, name string, cache *ReadCache, kept map[string]cachedFile, readAt time.Time) (read File, isDir bool) {
	stamp, stamped := stampOf(f)
	if c, ok := cache.lookup(name); ok && stamped && c.stamp == stamp {
		if content, inMemory := c.content(); inMemory {
			kept[name] = c
			return File{Content: content, Digest: c.digest}, false
		}
	}
	content, isDir, err := d.ReadOpened(f)
	if isDir || err != nil {
		return File{Err: err}, isDir
	}
	read = File{Content: content, Digest: sha256.Sum256(content)}
	if kept != nil && stamped && len(content) > 0 && int64(len(content)) == stamp.size && cache.settled(stamp, readAt) {
		kept[name] = cachedFile{stamp: stamp, first: weak.Make(&content[0]), digest: read.Digest}
	}
	return read, false
}

// settled reports whether a file of stamp, read at readAt, had last
// changed long enough before to be kept (racyWindow, or settle).
func (c *ReadCache) settled(stamp fileStamp, readAt time.Time) bool {
	window := racyWindow
	if c.settle > 0 {
		window = c.settle
	}
	settledBy := readAt.Add(-window)
	return time.Unix(stamp.ctime.Unix()).Before(settledBy) && time.Unix(stamp.mtime.Unix()).Before(settledBy)
}

func (c *ReadCache) lookup(name string) (cachedFile, bool) {
	if c == nil {
		return cachedFile{}, false
	}
	f, ok := c.files[name]
	return f, ok
}

// openBeneath opens name for reading relative to the directory dirfd
// (whose path is root, for errors), following symlinks only as long as
// they stay beneath it (EXDEV otherwise), never /proc's magic links.
// O_NONBLOCK keeps a FIFO from blocking the open; O_NOCTTY keeps a
// terminal from becoming the agent's.
func openBeneath(dirfd int, root, name string) (*os.File, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	path := filepath.Join(root, name)
	for attempt := 0; ; attempt++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		// EAGAIN: a rename elsewhere raced with a ".." in the resolution.
		if err == unix.EINTR || err == unix.EAGAIN && attempt < 10 {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "openat2", Path: path, Err: err}
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}

// isInside reports whether path is root or lies under it.
func isInside(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// ReadOpened reads an opened regular file of at most MaxSize bytes, and
// no more than one byte over that of a larger file. It reports
// directories instead of reading them. The type is that of the opened file
// (fstat), not of a path that may have changed since.
//
// Possible errors: ErrNotRegular (wrapped), ErrTooLarge (wrapped), the
// system's.
func (d Dir) ReadOpened(f *os.File) (content []byte, isDir bool, err error) {
	info, err := f.Stat()
	switch {
	case err != nil:
		return nil, false, err
	case info.IsDir():
		return nil, true, nil
	case !info.Mode().IsRegular():
		return nil, false, fmt.Errorf("%w: %s", ErrNotRegular, info.Mode().Type())
	}
	maxSize := int64(d.MaxSize)
	// One allocation of the size fstat gives, plus the byte that tells a
	// file over the cap; a file that grows meanwhile grows it, up to that.
	content = make([]byte, 0, min(info.Size(), maxSize)+1)
	for int64(len(content)) <= maxSize {
		if len(content) == cap(content) {
			content = slices.Grow(content, 1)
		}
		n, err := f.Read(content[len(content):min(int64(cap(content)), maxSize+1)])
		content = content[:len(content)+n]
		if errors.Is(err, io.EOF) {
			return content, false, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
	return nil, false, d.TooLargeError()
}

// TooLargeError returns the error of a file over MaxSize: "policy file too
// large: more than the cap of 4194304 bytes (4 MiB)", wrapping
// ErrTooLarge.
func (d Dir) TooLargeError() error {
	return fmt.Errorf("%w: more than the cap of %d bytes (%d MiB)",
		&kindError{msg: d.What + " file too large", sentinel: ErrTooLarge}, d.MaxSize, d.MaxSize>>20)
}

// errOutside is ErrOutsideDirectory, naming the directory's kind.
func (d Dir) errOutside() error {
	return &kindError{msg: "symlink target is outside the " + d.What + " directory, not read", sentinel: ErrOutsideDirectory}
}
