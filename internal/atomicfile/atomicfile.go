// SPDX-License-Identifier: Apache-2.0

// Package atomicfile replaces the agent's state files so that whoever reads
// one, the next start after a crash included, sees the old content or the
// new, never a part of either.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// TempPattern is the os.CreateTemp pattern of the temporary files that
// Write writes before renaming them to path: hidden, beside path. A crash
// can leave one behind, half-written; RemoveTemps removes them.
func TempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// Write replaces the file at path (mode 0600) with what write writes: into
// a temporary file in the same directory, which is synced, renamed over
// path, and then the directory is synced, so that the rename survives a
// crash too.
//
// Possible errors: write's, and those of creating, writing, syncing and
// renaming the temporary file and of syncing the directory, all wrapped
// with path. The file at path is unchanged then.
func Write(path string, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, TempPattern(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	err = write(tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// RemoveTemps removes the temporary files of path that Write left behind
// when the process died while writing. Call it before the first Write.
//
// Possible errors: those of removing the files, joined.
func RemoveTemps(path string) error {
	stale, err := filepath.Glob(filepath.Join(filepath.Dir(path), TempPattern(path)))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range stale {
		errs = append(errs, os.Remove(name))
	}
	return errors.Join(errs...)
}
