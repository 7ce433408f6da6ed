// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
)

// savedVersion is the version of the saved file's format.
const savedVersion = 1

// Saved is the file, in the state directory, that holds the content of
// the version in force of each file of a directory, as it was read, so
// that after a restart a file that is invalid then keeps the version in
// force before it. Saving the content (not what it parsed to) means that
// what is restored is validated again by the same parser.
//
// The file is JSON: {"version":1,"<DirKey>":"<dir>","files":[{"file":..,
// "content":..},..]}, one entry a line, readable.
type Saved struct {
	// Path is the saved file's path.
	Path string
	// DirKey is the key of the directory the versions are of
	// ("policyDir"): versions of another directory are not restored.
	DirKey string
	// Name says what the file holds, in errors: "policies in force".
	Name string
	// MaxSize caps the saved file, in what is written and in what is read
	// back, so that memory stays bounded whatever is in the state
	// directory.
	MaxSize int
}

// SavedFile is a file's content as saved.
type SavedFile struct {
	File    string `json:"file"`
	Content string `json:"content"`
}

// CorruptError returns ErrCorruptSaved, naming what the file holds
// ("corrupt saved policies in force").
func (s Saved) CorruptError() error {
	return &kindError{msg: "corrupt saved " + s.Name, sentinel: ErrCorruptSaved}
}

// Read reads the saved versions for the directory d. A missing file, or
// one saved for another directory, gives nothing (otherDir says which).
// The files are in the order they were saved (their names' order); their
// contents are not parsed here.
//
// Possible errors: CorruptError (wrapping ErrCorruptSaved) for a file
// larger than MaxSize, that does not decode, is of another version, lists
// a file twice, a name that is not a YAML file's, or content over
// d.MaxSize; errors reading the file.
func (s Saved) Read(d Dir) (files []SavedFile, otherDir string, err error) {
	path := s.Path
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read saved %s: %w", s.Name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(s.MaxSize)+1))
	if err != nil {
		return nil, "", fmt.Errorf("read saved %s %s: %w", s.Name, path, err)
	}
	if len(data) > s.MaxSize {
		return nil, "", fmt.Errorf("%w %s: larger than %d bytes", s.CorruptError(), path, s.MaxSize)
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil {
		return nil, "", fmt.Errorf("%w %s: %w", s.CorruptError(), path, err)
	}
	if dec.More() {
		return nil, "", fmt.Errorf("%w %s: trailing data", s.CorruptError(), path)
	}
	var (
		version int
		dir     string
	)
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		var target any
		switch key {
		case "version":
			target = &version
		case s.DirKey:
			target = &dir
		case "files":
			target = &files
		default:
			return nil, "", fmt.Errorf("%w %s: json: unknown field %q", s.CorruptError(), path, key)
		}
		dec := json.NewDecoder(bytes.NewReader(fields[key]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(target); err != nil {
			return nil, "", fmt.Errorf("%w %s: %s: %w", s.CorruptError(), path, key, err)
		}
	}
	if version != savedVersion {
		return nil, "", fmt.Errorf("%w %s: version %d, want %d", s.CorruptError(), path, version, savedVersion)
	}
	if dir != d.Path {
		return nil, dir, nil
	}
	seen := make(map[string]bool, len(files))
	for _, entry := range files {
		if !IsYAMLFile(entry.File) || filepath.Base(entry.File) != entry.File {
			return nil, "", fmt.Errorf("%w %s: %q is not the name of %s file", s.CorruptError(), path, entry.File, withArticle(d.What))
		}
		if seen[entry.File] {
			return nil, "", fmt.Errorf("%w %s: %s listed twice", s.CorruptError(), path, entry.File)
		}
		seen[entry.File] = true
		if len(entry.Content) > d.MaxSize {
			return nil, "", fmt.Errorf("%w %s: %s: %w", s.CorruptError(), path, entry.File, d.TooLargeError())
		}
	}
	if files == nil {
		files = []SavedFile{}
	}
	return files, "", nil
}

// Write replaces the saved file with the given contents of the files in
// force of the directory dir (by file name), atomically. Files that would
// take the file over MaxSize are left out, in name order; they are
// returned.
//
// Possible errors: those of atomicfile.Write.
func (s Saved) Write(dir string, contents map[string][]byte) (left []string, err error) {
	return s.WriteCached(dir, contents, nil, nil)
}

// SavedEntries keeps the entries of the saved file as the last
// WriteCached encoded them, each with the digest of the content it was
// encoded from: a write re-encodes only the files whose content changed,
// where encoding every file again was most of what a change of one file
// cost. It keeps only the entries written: no more than MaxSize bytes.
// The zero value is ready; it is not safe for concurrent use.
type SavedEntries struct {
	entries map[string]savedEntry
}

type savedEntry struct {
	digest  [sha256.Size]byte
	encoded []byte
}

// WriteCached is Write, taking the entry of each file whose digest (the
// sha256 of its content, as Versions.InForceContents gives it) is the
// one cache holds from cache rather than encoding it again, and keeping
// the entries it writes in cache for the next write. The saved file's
// bytes are those Write writes. A nil cache or digests: every entry is
// encoded.
//
// Possible errors: those of atomicfile.Write.
func (s Saved) WriteCached(dir string, contents map[string][]byte, digests map[string][sha256.Size]byte, cache *SavedEntries) (left []string, err error) {
	var written map[string]savedEntry
	encode := func(name string) ([]byte, error) {
		digest, known := digests[name]
		if cached, ok := cache.lookup(name); ok && known && cached.digest == digest {
			written[name] = cached
			return cached.encoded, nil
		}
		encoded, err := marshalNoHTMLEscape(SavedFile{File: name, Content: string(contents[name])})
		if err == nil && cache != nil && known {
			written[name] = savedEntry{digest: digest, encoded: encoded}
		}
		return encoded, err
	}
	err = atomicfile.Write(s.Path, func(w io.Writer) error {
		left = nil
		written = map[string]savedEntry{}
		out := bufio.NewWriter(w)
		key, err := json.Marshal(s.DirKey)
		if err != nil {
			return err
		}
		value, err := json.Marshal(dir)
		if err != nil {
			return err
		}
		// The entries are encoded one by one, so that the size is known
		// before one is written: {"version":1,"<DirKey>":"..","files":[..]}.
		head := fmt.Appendf(nil, `{"version":%d,%s:%s,"files":[`, savedVersion, key, value)
		const tail = "\n]}\n"
		size := len(head) + len(tail)
		out.Write(head)
		first := true
		for _, name := range slices.Sorted(maps.Keys(contents)) {
			entry, err := encode(name)
			if err != nil {
				return err
			}
			if size+len(entry)+2 > s.MaxSize {
				left = append(left, name)
				delete(written, name)
				continue
			}
			if !first {
				out.WriteString(",")
			}
			first = false
			out.WriteString("\n")
			out.Write(entry)
			size += len(entry) + 2
		}
		out.WriteString(tail)
		return out.Flush()
	})
	if cache != nil && written != nil {
		// Also after a failed write: the entries are right whatever
		// became of the file.
		cache.entries = written
	}
	return left, err
}

func (c *SavedEntries) lookup(name string) (savedEntry, bool) {
	if c == nil {
		return savedEntry{}, false
	}
	e, ok := c.entries[name]
	return e, ok
}

// marshalNoHTMLEscape encodes v as JSON without escaping <, > and & (a
// file's content stays readable and no larger than it must be).
func marshalNoHTMLEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// SaveKey identifies a set of versions in force: the files' names and the
// digests of their contents, so that an unchanged set is not written
// again.
func SaveKey(digests map[string][sha256.Size]byte) [sha256.Size]byte {
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(digests)) {
		digest := digests[name]
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write(digest[:])
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}

// withArticle returns "a policy", "an endpoint".
func withArticle(what string) string {
	if what != "" && strings.ContainsRune("aeiou", rune(what[0])) {
		return "an " + what
	}
	return "a " + what
}
