// SPDX-License-Identifier: Apache-2.0

package policycell

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
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

const (
	// InForceFileName is the name, in the state directory, of the saved
	// versions of the policy files in force.
	InForceFileName = "policies-in-force.json"

	inForceVersion = 1

	// maxInForceSize caps the saved file, in what is written and in what is
	// read back at start, so that memory stays bounded whatever is in the
	// state directory. Files that do not fit are left out, in name order,
	// and logged.
	maxInForceSize = 32 << 20
)

// inForceFile is the saved file: the content of the version in force of
// each policy file, as it was read. Saving the content (not the parsed
// policies) means that what is restored is validated again by the same
// parser. Which file holds a policy name is the file whose content has it.
type inForceFile struct {
	Version int `json:"version"`
	// PolicyDir is the --policy-dir the versions are of: files of another
	// directory are not restored.
	PolicyDir string         `json:"policyDir"`
	Files     []inForceEntry `json:"files"`
}

type inForceEntry struct {
	File    string `json:"file"`
	Content string `json:"content"`
}

// savedFile is a policy file's version in force as restored from the save.
type savedFile struct {
	content  []byte
	digest   [sha256.Size]byte
	policies []*policy.Policy
}

// savedInForce keeps <state-dir>/policies-in-force.json in step with the
// versions of the policy files in force.
type savedInForce struct {
	path string // empty: not saved
	// saved identifies what the file holds (saveKey), once written.
	saved    [sha256.Size]byte
	hasSaved bool
	// err is why the last save failed (failed: it is retried) or left
	// files out; logged is the last one logged, so that each is logged
	// once.
	err    error
	failed bool
	logged string
}

// readInForce reads the saved versions in force for the policy directory
// dir. A missing file, or one saved for another directory, restores
// nothing (otherDir says which). Every file's content is parsed again.
//
// Possible errors: ErrCorruptInForce (wrapped) for a file larger than
// maxInForceSize, that does not decode, is of another version, lists a
// file twice or a name that is not a policy file's, has content that does
// not parse, or policy names held by two files; errors reading the file.
func readInForce(path, dir string) (saved map[string]savedFile, otherDir string, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read saved policies in force: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxInForceSize+1))
	if err != nil {
		return nil, "", fmt.Errorf("read saved policies in force %s: %w", path, err)
	}
	if len(data) > maxInForceSize {
		return nil, "", fmt.Errorf("%w %s: larger than %d bytes", ErrCorruptInForce, path, maxInForceSize)
	}
	var file inForceFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return nil, "", fmt.Errorf("%w %s: %w", ErrCorruptInForce, path, err)
	}
	if dec.More() {
		return nil, "", fmt.Errorf("%w %s: trailing data", ErrCorruptInForce, path)
	}
	if file.Version != inForceVersion {
		return nil, "", fmt.Errorf("%w %s: version %d, want %d", ErrCorruptInForce, path, file.Version, inForceVersion)
	}
	if file.PolicyDir != dir {
		return nil, file.PolicyDir, nil
	}
	saved = make(map[string]savedFile, len(file.Files))
	holder := map[string]string{}
	for _, entry := range file.Files {
		if !isPolicyFile(entry.File) || strings.ContainsRune(entry.File, filepath.Separator) {
			return nil, "", fmt.Errorf("%w %s: %q is not the name of a policy file", ErrCorruptInForce, path, entry.File)
		}
		if _, dup := saved[entry.File]; dup {
			return nil, "", fmt.Errorf("%w %s: %s listed twice", ErrCorruptInForce, path, entry.File)
		}
		content := []byte(entry.Content)
		if len(content) > maxFileSize {
			return nil, "", fmt.Errorf("%w %s: %s: %w", ErrCorruptInForce, path, entry.File, errTooLarge())
		}
		policies, err := policyfile.Parse(entry.File, content)
		if err != nil {
			return nil, "", fmt.Errorf("%w %s: %w", ErrCorruptInForce, path, err)
		}
		if err := conflict(entry.File, policies, holder); err != nil {
			return nil, "", fmt.Errorf("%w %s: %w", ErrCorruptInForce, path, err)
		}
		for _, p := range policies {
			holder[p.Name] = entry.File
		}
		saved[entry.File] = savedFile{content: content, digest: sha256.Sum256(content), policies: policies}
	}
	return saved, "", nil
}

// writeInForce replaces the saved file at path with the given contents of
// the files in force (by file name), atomically. Files that would take the
// file over maxInForceSize are left out, in name order; they are returned.
//
// Possible errors: those of atomicfile.Write.
func writeInForce(path, dir string, contents map[string][]byte) (left []string, err error) {
	err = atomicfile.Write(path, func(w io.Writer) error {
		left = nil
		out := bufio.NewWriter(w)
		head, err := json.Marshal(struct {
			Version   int    `json:"version"`
			PolicyDir string `json:"policyDir"`
		}{inForceVersion, dir})
		if err != nil {
			return err
		}
		// The entries are encoded one by one, so that the size is known
		// before one is written: {"version":1,"policyDir":"..","files":[..]}.
		head = append(head[:len(head)-1], `,"files":[`...)
		const tail = "\n]}\n"
		size := len(head) + len(tail)
		out.Write(head)
		first := true
		for _, name := range slices.Sorted(maps.Keys(contents)) {
			entry, err := marshalNoHTMLEscape(inForceEntry{File: name, Content: string(contents[name])})
			if err != nil {
				return err
			}
			if size+len(entry)+2 > maxInForceSize {
				left = append(left, name)
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
	return left, err
}

// marshalNoHTMLEscape encodes v as JSON without escaping <, > and & (a
// policy file's content stays readable and no larger than it must be).
func marshalNoHTMLEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// saveKey identifies a set of versions in force: the files' names and the
// digests of their contents.
func saveKey(digests map[string][sha256.Size]byte) [sha256.Size]byte {
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

// restoreInForce puts the versions in force that the previous run saved
// in place, before the directory is first read: a file that is invalid
// now keeps its saved version, and a policy name stays with the file that
// held it. A corrupt save is moved aside and logged, and nothing is
// restored then.
func (l *loader) restoreInForce() {
	path := l.saved.path
	if path == "" {
		return
	}
	if err := atomicfile.RemoveTemps(path); err != nil {
		l.log.Warn("Cannot remove stale temporary files of the saved policies in force", "path", path, "error", err)
	}
	saved, otherDir, err := readInForce(path, l.dir)
	switch {
	case errors.Is(err, ErrCorruptInForce):
		aside, moveErr := statedir.SetAside(path)
		l.log.Error("Saved policies in force are corrupt; moved aside, starting from the policy files alone",
			"path", path, "moved-to", aside, "error", err)
		if moveErr != nil {
			// The next save replaces it: only the evidence is lost.
			l.log.Error("Cannot move the corrupt saved policies in force aside", "path", path, "error", moveErr)
		}
		return
	case err != nil:
		l.log.Error("Cannot read the saved policies in force, starting from the policy files alone", "path", path, "error", err)
		return
	case otherDir != "":
		l.log.Info("Saved policies in force are of another policy directory, not restored",
			"path", path, "saved-for", otherDir, "dir", l.dir)
		return
	case saved == nil:
		return
	}
	policies := 0
	for name, s := range saved {
		// A version over the policy map's size (--policy-map-max-entries
		// lowered since) is not put in force: the file as it is now decides.
		if _, err := CountEntries(name, s.policies, l.maxEntries); err != nil {
			l.log.Warn("Saved version of a policy file is over the policy map's size, not restored", "file", name, "error", err)
			continue
		}
		l.files[name] = &policyFile{
			digest: s.digest, content: s.content, parsed: s.policies,
			inForce: s.policies, inForceDigest: s.digest, inForceContent: s.content, hasInForce: true,
			restored: true,
		}
		policies += len(s.policies)
	}
	l.log.Info("Restored the policies in force before the restart", "path", path, "files", len(saved), "policies", policies)
}

// saveInForce saves the versions in force, if they changed since the last
// save or the last save failed.
func (l *loader) saveInForce() {
	s := &l.saved
	if s.path == "" {
		return
	}
	digests := map[string][sha256.Size]byte{}
	contents := map[string][]byte{}
	for name, f := range l.files {
		if f.hasInForce {
			digests[name], contents[name] = f.inForceDigest, f.inForceContent
		}
	}
	key := saveKey(digests)
	if s.hasSaved && key == s.saved {
		return
	}
	left, err := writeInForce(s.path, l.dir, contents)
	s.saved, s.hasSaved, s.failed = key, err == nil, err != nil
	switch {
	case err != nil:
		s.err = fmt.Errorf("save the policies in force for a restart, retrying: %w", err)
	case len(left) > 0:
		s.err = fmt.Errorf("save the policies in force for a restart: %w (%d bytes): left out %s",
			ErrInForceTooLarge, maxInForceSize, strings.Join(left, ", "))
	default:
		if s.logged != "" {
			l.log.Info("Saved the policies in force again", "path", s.path)
		}
		s.err, s.logged = nil, ""
		return
	}
	if msg := s.err.Error(); msg != s.logged {
		s.logged = msg
		l.log.Error("Cannot save all policies in force: after a restart, an invalid file among those not saved has nothing in force",
			"path", s.path, "error", s.err)
	}
}
