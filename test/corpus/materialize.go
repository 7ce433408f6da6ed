// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// read returns the source's content from the first mirror directory that
// holds it, and where it came from. In each directory it looks for a git
// repository (bare or not) at <dir>/<owner+name>/repo, as `fetch` lays
// the mirrors out, or at <dir>/<owner+name>, and reads the path at the
// commit; else for a stored copy of the file at
// <dir>/<owner+name>/<commit>/<path>, for repositories whose history is
// not at hand (a copy taken from the commit's raw URL).
//
// Possible errors: ErrNotFound when no directory holds it, ErrChecksum
// when the content found is not the manifest's.
func (s Source) read(mirrors []string) ([]byte, string, error) {
	var looked []string
	for _, dir := range mirrors {
		base := filepath.Join(dir, s.Mirror())
		for _, repo := range []string{filepath.Join(base, "repo"), base} {
			if !isGitDir(repo) {
				continue
			}
			looked = append(looked, repo)
			content, err := exec.Command("git", "-C", repo, "cat-file", "blob", s.Commit+":"+s.Path).Output()
			if err != nil {
				continue // this mirror lacks the commit or the path: try the next
			}
			return s.check(content, "git "+repo)
		}
		copyPath := filepath.Join(base, s.Commit, filepath.FromSlash(s.Path))
		looked = append(looked, copyPath)
		content, err := os.ReadFile(copyPath)
		if err == nil {
			return s.check(content, "copy "+copyPath)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("read %s: %w", copyPath, err)
		}
	}
	return nil, "", fmt.Errorf("%w: %s@%s:%s (looked in %s)", ErrNotFound, s.Repository, s.Commit, s.Path, strings.Join(looked, ", "))
}

func (s Source) check(content []byte, from string) ([]byte, string, error) {
	sum := sha256.Sum256(content)
	if got := hex.EncodeToString(sum[:]); got != s.SHA256 {
		return nil, "", fmt.Errorf("%w: %s@%s:%s from %s has sha256 %s, want %s",
			ErrChecksum, s.Repository, s.Commit, s.Path, from, got, s.SHA256)
	}
	return content, from, nil
}

func isGitDir(dir string) bool {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--absolute-git-dir").Output()
	if err != nil {
		return false
	}
	// A directory inside another checkout (this one, say) must not count
	// as a mirror: the git directory must be its own.
	gitDir := string(bytes.TrimSpace(out))
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	return gitDir == abs || gitDir == filepath.Join(abs, ".git")
}

// materialize writes every source under dir with the names of fileNames,
// read from the mirrors, and returns the names.
//
// Possible errors: ErrNotFound and ErrChecksum (all of them, joined, so
// that one run lists every missing file); a write error.
func materialize(sources []Source, mirrors []string, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	names := fileNames(sources)
	var errs []error
	for i, s := range sources {
		content, _, err := s.read(mirrors)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, names[i]), content, 0o644); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return names, nil
}
