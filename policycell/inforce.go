// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/internal/yamldir"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

const (
	// InForceFileName is the name, in the state directory, of the saved
	// versions of the policy files in force.
	InForceFileName = "policies-in-force.json"

	// maxInForceSize caps the saved file, in what is written and in what is
	// read back at start, so that memory stays bounded whatever is in the
	// state directory. Files that do not fit are left out, in name order,
	// and logged.
	maxInForceSize = 32 << 20
)

// savedPolicies is the saved file at path (yamldir.Saved): the content of
// the version in force of each policy file, as it was read. Which file
// holds a policy name is the file whose content has it.
func savedPolicies(path string) yamldir.Saved {
	return yamldir.Saved{Path: path, DirKey: "policyDir", Name: "policies in force", MaxSize: maxInForceSize}
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
	// saved identifies what the file holds (yamldir.SaveKey), once written.
	saved    [sha256.Size]byte
	hasSaved bool
	// err is why the last save failed (failed: it is retried) or left
	// files out; logged is the last one logged, so that each is logged
	// once.
	err    error
	failed bool
	logged string
	// entries are the saved file's entries, so that a save encodes only
	// the files that changed.
	entries yamldir.SavedEntries
}

// readInForce reads the saved versions in force for the policy directory
// dir. A missing file, or one saved for another directory, restores
// nothing (otherDir says which). Every file's content is parsed again.
//
// Possible errors: ErrCorruptInForce (wrapped) for a file larger than
// maxInForceSize, that does not decode, is of another version, lists a
// file twice or a name that is not a policy file's, has content that does
// not parse or that this agent does not enforce (notEnforced, unless
// fqdnEnforced), or policy names held by two files; errors reading the
// file.
func readInForce(path, dir string, fqdnEnforced bool) (saved map[string]savedFile, otherDir string, err error) {
	s := savedPolicies(path)
	files, otherDir, err := s.Read(policyDir(dir))
	if err != nil || files == nil {
		return nil, otherDir, err
	}
	saved = make(map[string]savedFile, len(files))
	holder := map[string]string{}
	for _, entry := range files {
		content := []byte(entry.Content)
		policies, err := policyfile.Parse(entry.File, content)
		if err == nil && !fqdnEnforced {
			// Saved by an agent that enforces more: not this one's to take.
			err = notEnforced(entry.File, policies)
		}
		if err != nil {
			return nil, "", fmt.Errorf("%w %s: %w", s.CorruptError(), path, err)
		}
		if err := conflict(entry.File, policies, holder); err != nil {
			return nil, "", fmt.Errorf("%w %s: %w", s.CorruptError(), path, err)
		}
		for _, p := range policies {
			holder[p.Name] = entry.File
		}
		saved[entry.File] = savedFile{content: content, digest: sha256.Sum256(content), policies: policies}
	}
	return saved, "", nil
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
	saved, otherDir, err := readInForce(path, l.dir, l.fqdnEnforced)
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
		l.files.Restore(name, s.content, s.policies)
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
	contents, digests := l.files.InForceContents()
	key := yamldir.SaveKey(digests)
	if s.hasSaved && key == s.saved {
		return
	}
	left, err := savedPolicies(s.path).WriteCached(l.dir, contents, digests, &s.entries)
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
