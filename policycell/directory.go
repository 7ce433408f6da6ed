package policycell

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

var (
	// ErrOutsideDirectory rejects a policy file that is a symlink to a
	// file outside the policy directory.
	ErrOutsideDirectory = errors.New("symlink target is outside the policy directory")

	// ErrNotRegular rejects a policy file that is neither a regular file
	// nor a symlink to one (a FIFO could block the reader).
	ErrNotRegular = errors.New("not a regular file")

	// ErrTooLarge rejects a policy file larger than maxFileSize.
	ErrTooLarge = errors.New("policy file too large")
)

// maxFileSize bounds what is read of one policy file.
const maxFileSize = 64 << 20

// listing is what one read of the policy directory found.
type listing struct {
	// files are the policy files by name: their content, or why it could
	// not be read.
	files map[string]fileContent

	// watchDirs are the directories whose changes can change the policy
	// files: the policy directory and those holding symlink targets.
	watchDirs []string
}

type fileContent struct {
	content []byte
	err     error
}

// isPolicyFile reports whether a directory entry's name makes it a policy
// file: *.yaml or *.yml, not hidden (which also skips Kubernetes'
// "..data" and its timestamped directories, and editors' swap files).
func isPolicyFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// readDirectory reads the policy files directly in dir. Subdirectories
// (and symlinks to directories) are ignored. Symlinks are followed, so that
// Kubernetes ConfigMap mounts work, but only to files inside dir (after
// resolving dir's own symlinks): a link out of the directory is an error
// of that file.
//
// Possible errors: the directory cannot be resolved or listed. Errors of
// single files are in the listing.
func readDirectory(dir string) (listing, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return listing{}, err
	}
	if root, err = filepath.Abs(root); err != nil {
		return listing{}, err
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return listing{}, err
	}
	found := listing{files: map[string]fileContent{}, watchDirs: []string{root}}
	for _, entry := range entries {
		name := entry.Name()
		if !isPolicyFile(name) || entry.IsDir() {
			continue
		}
		path := filepath.Join(root, name)
		if entry.Type()&fs.ModeSymlink != 0 {
			target, err := resolveInside(root, path)
			if err != nil {
				found.files[name] = fileContent{err: err}
				continue
			}
			path = target
			found.watchDirs = append(found.watchDirs, filepath.Dir(target))
		}
		content, isDir, err := readPolicyFile(path)
		if isDir {
			continue
		}
		found.files[name] = fileContent{content: content, err: err}
	}
	slices.Sort(found.watchDirs)
	found.watchDirs = slices.Compact(found.watchDirs)
	return found, nil
}

// resolveInside resolves a symlink and checks that its target lies inside
// root.
func resolveInside(root, path string) (string, error) {
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("resolve symlink: %w", err)
	}
	rel, err := filepath.Rel(root, target)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: %s", ErrOutsideDirectory, target)
	}
	return target, nil
}

// readPolicyFile reads a regular file of at most maxFileSize bytes. It
// reports directories instead of reading them. The type is checked before
// opening: opening a FIFO would block.
func readPolicyFile(path string) (content []byte, isDir bool, err error) {
	info, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, false, err
	case info.IsDir():
		return nil, true, nil
	case !info.Mode().IsRegular():
		return nil, false, fmt.Errorf("%w: %s", ErrNotRegular, info.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	content, err = io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, false, err
	}
	if len(content) > maxFileSize {
		return nil, false, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, maxFileSize)
	}
	return content, false, nil
}
