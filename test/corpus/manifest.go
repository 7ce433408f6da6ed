// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// manifestHeader is the manifest's first line that is not a comment.
const manifestHeader = "repository\tcommit\tpath\tsha256\tdocuments\tkinds"

var (
	repositoryPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	commitPattern     = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sha256Pattern     = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Source is one corpus file: a path in a public repository at a commit,
// and what its content is.
type Source struct {
	Repository string // owner/name on GitHub
	Commit     string
	Path       string
	SHA256     string // of the file's content
	Documents  int    // YAML documents in the file
	Kinds      string // the kinds of its documents, comma-separated
}

// Mirror is the directory name of the repository's mirror: owner+name, as
// the fetched mirrors are laid out.
func (s Source) Mirror() string {
	return strings.Replace(s.Repository, "/", "+", 1)
}

// URL is where GitHub serves the file's content at the commit.
func (s Source) URL() string {
	return "https://raw.githubusercontent.com/" + s.Repository + "/" + s.Commit + "/" + s.Path
}

// ParseManifest reads the manifest: comment lines (#) and blank lines,
// the header, then one tab-separated row per file.
//
// Possible errors: ErrManifest, naming the line, for a missing header, a
// row without six fields, a malformed repository, commit or sha256, a
// path that is absolute or leaves the repository, a document count below
// 1, or a repository and path listed twice; a read error of r.
func ParseManifest(r io.Reader) ([]Source, error) {
	var sources []Source
	seen := map[string]int{}
	header := false
	scanner := bufio.NewScanner(r)
	for n := 1; scanner.Scan(); n++ {
		line := scanner.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !header {
			if line != manifestHeader {
				return nil, fmt.Errorf("%w: line %d: want the header %q", ErrManifest, n, manifestHeader)
			}
			header = true
			continue
		}
		s, err := parseRow(line)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrManifest, n, err)
		}
		key := s.Repository + ":" + s.Path
		if first, ok := seen[key]; ok {
			return nil, fmt.Errorf("%w: line %d: %s is listed on line %d already", ErrManifest, n, key, first)
		}
		seen[key] = n
		sources = append(sources, s)
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if !header {
		return nil, fmt.Errorf("%w: no header %q", ErrManifest, manifestHeader)
	}
	return sources, nil
}

func parseRow(line string) (Source, error) {
	fields := strings.Split(line, "\t")
	if len(fields) != 6 {
		return Source{}, fmt.Errorf("%d fields, want 6 (%s)", len(fields), manifestHeader)
	}
	s := Source{Repository: fields[0], Commit: fields[1], Path: fields[2], SHA256: fields[3], Kinds: fields[5]}
	switch {
	case !repositoryPattern.MatchString(s.Repository):
		return Source{}, fmt.Errorf("repository %q: want owner/name", s.Repository)
	case !commitPattern.MatchString(s.Commit):
		return Source{}, fmt.Errorf("commit %q: want 40 lower-case hex digits", s.Commit)
	case s.Path == "" || path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path || strings.HasPrefix(s.Path, "../"):
		return Source{}, fmt.Errorf("path %q: want a clean path inside the repository", s.Path)
	case !sha256Pattern.MatchString(s.SHA256):
		return Source{}, fmt.Errorf("sha256 %q: want 64 lower-case hex digits", s.SHA256)
	}
	docs, err := strconv.Atoi(fields[4])
	if err != nil || docs < 1 {
		return Source{}, fmt.Errorf("documents %q: want a number of at least 1", fields[4])
	}
	s.Documents = docs
	return s, nil
}

// fileNames gives each source a distinct flat file name, in manifest
// order: its row number and the path's base name, so that a policy
// directory can hold them all and a name leads back to the row.
func fileNames(sources []Source) []string {
	names := make([]string, len(sources))
	for i, s := range sources {
		names[i] = fmt.Sprintf("%03d-%s", i+1, path.Base(s.Path))
	}
	return names
}
