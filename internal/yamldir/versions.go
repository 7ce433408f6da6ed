// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"crypto/sha256"
	"maps"
	"slices"
)

// Versions keeps, for each file of a directory, what its current content
// parses to and the version of it in force: a file is the unit of
// validity, and a file whose current content is rejected (unreadable,
// invalid, emptied, or claiming what another file holds) keeps the version
// that was in force. T is what a file parses to.
//
// It is not safe for concurrent use: one job reads the directory and
// calls it.
type Versions[T any] struct {
	// Parse parses a file's content; an error rejects that content.
	Parse func(file string, content []byte) (T, error)
	// Empty reports whether content parsed to nothing (white space,
	// comments, document separators): such content of a file whose
	// version in force is not empty is rejected with EmptyError, so that
	// an editor that truncates a file before it writes it again does not
	// remove what it held in between. Removing the file removes it.
	Empty      func(parsed T) bool
	EmptyError func(file string) error
	// ReadError wraps the error of a file that could not be read.
	ReadError func(file string, err error) error
	// Claims are the names a version holds alone among the files in force
	// (policy names; endpoint names and addresses); nil: none.
	Claims func(parsed T) []string
	// Conflict returns the error that rejects a file's version whose
	// claims another file holds (holder: claim -> file), or nil.
	Conflict func(file string, parsed T, holder map[string]string) error

	files map[string]*version[T]
}

// version is what Versions knows of one file.
type version[T any] struct {
	// digest identifies the content last read; parsed (hasParsed) and
	// parseErr are the outcome of parsing it. content is kept while it
	// may come into force (and be saved): not when it does not parse.
	digest    [sha256.Size]byte
	content   []byte
	parsed    T
	hasParsed bool
	parseErr  error
	readErr   error

	// inForce is the version in force, and inForceDigest and
	// inForceContent the content it came from (hasInForce: any).
	// restored: that version was restored from the save of the previous
	// run and not read since.
	inForce        T
	inForceDigest  [sha256.Size]byte
	inForceContent []byte
	hasInForce     bool
	restored       bool

	// rejected is why the current content is not in force.
	rejected error
	// reported is the last rejection reported, so that each is reported
	// once.
	reported string
}

// ChangeKind is what Decide changed of a file.
type ChangeKind int

const (
	// Accepted: the file's current content is in force now.
	Accepted ChangeKind = iota + 1
	// ValidAgain: the file was rejected and is valid again with the
	// version that is in force (an emptied file written back).
	ValidAgain
	// Rejected: the file's current content is rejected (for the first
	// time, or for another reason than before); its version in force, if
	// any, stays.
	Rejected
)

// Change is one change Decide made, to log.
type Change[T any] struct {
	File string
	Kind ChangeKind
	// InForce is the file's version in force (HasInForce: any), Restored
	// whether it is the one restored from the previous run.
	InForce    T
	HasInForce bool
	Restored   bool
	// Err is why the file is rejected (Rejected).
	Err error
}

// Status is a file as Decide left it.
type Status[T any] struct {
	File string
	// InForce is the file's version in force (HasInForce: any).
	InForce    T
	HasInForce bool
	// Err is why the file's current content is not in force; nil if it
	// is.
	Err error
}

func (v *Versions[T]) file(name string) *version[T] {
	if v.files == nil {
		v.files = map[string]*version[T]{}
	}
	f := v.files[name]
	if f == nil {
		f = &version[T]{}
		v.files[name] = f
	}
	return f
}

// Restore puts a version restored from the previous run's save (Saved) in
// force for file, before the directory is first read: if the file is
// invalid now, this version stays.
func (v *Versions[T]) Restore(file string, content []byte, parsed T) {
	digest := sha256.Sum256(content)
	*v.file(file) = version[T]{
		digest: digest, content: content, parsed: parsed, hasParsed: true,
		inForce: parsed, inForceDigest: digest, inForceContent: content, hasInForce: true,
		restored: true,
	}
}

// Update takes a read of the directory: files no longer there are
// forgotten (their versions in force go; they are returned, in name
// order), and the content of each file that changed (by the digest the
// listing gives with it) is parsed. Call Decide next.
func (v *Versions[T]) Update(found Listing) (removed []string) {
	for _, name := range slices.Sorted(maps.Keys(v.files)) {
		if _, ok := found.Files[name]; !ok {
			delete(v.files, name)
			removed = append(removed, name)
		}
	}
	for name, read := range found.Files {
		f := v.file(name)
		f.readErr = nil
		if read.Err != nil {
			f.readErr = v.ReadError(name, read.Err)
			continue
		}
		digest := read.Digest
		if !f.hasParsed && f.parseErr == nil || digest != f.digest {
			var zero T
			f.digest, f.content = digest, read.Content
			f.parsed, f.parseErr = v.Parse(name, read.Content)
			f.hasParsed = f.parseErr == nil
			if f.parseErr != nil {
				f.content, f.parsed = nil, zero
			}
		}
	}
	return removed
}

// Decide chooses the version of each file in force. A file whose content
// is valid but not in force is accepted unless it claims what another
// file holds; files are tried in name order, and again as long as
// accepting one frees claims (a name that moves from one file to another
// in one change is accepted whatever the file names). It returns what
// changed: the files accepted, in name order, then those rejected or
// valid again.
func (v *Versions[T]) Decide() []Change[T] {
	holder := map[string]string{} // claim -> file holding it in force
	for name, f := range v.files {
		for _, c := range v.claims(f.inForce, f.hasInForce) {
			holder[c] = name
		}
	}
	var pending []string
	accepted := map[string]bool{}
	for name, f := range v.files {
		f.rejected = nil
		switch {
		case f.readErr != nil:
			f.rejected = f.readErr
		case f.parseErr != nil:
			f.rejected = f.parseErr
		case v.Empty(f.parsed) && f.hasInForce && !v.Empty(f.inForce):
			f.rejected = v.EmptyError(name)
		case !f.hasInForce || f.inForceDigest != f.digest:
			pending = append(pending, name)
		}
	}
	slices.Sort(pending)
	var changes []Change[T]
	for progress := true; progress && len(pending) > 0; {
		progress = false
		remaining := pending[:0]
		for _, name := range pending {
			f := v.files[name]
			if v.Conflict != nil {
				if err := v.Conflict(name, f.parsed, holder); err != nil {
					f.rejected = err
					remaining = append(remaining, name)
					continue
				}
			}
			for _, c := range v.claims(f.inForce, f.hasInForce) {
				if holder[c] == name {
					delete(holder, c)
				}
			}
			for _, c := range v.claims(f.parsed, true) {
				holder[c] = name
			}
			f.inForce, f.inForceDigest, f.inForceContent, f.hasInForce = f.parsed, f.digest, f.content, true
			f.rejected, f.restored = nil, false
			progress = true
			accepted[name] = true
			changes = append(changes, Change[T]{File: name, Kind: Accepted, InForce: f.inForce, HasInForce: true})
		}
		pending = remaining
	}
	for name, f := range v.files {
		if f.rejected == nil {
			if f.reported != "" && !accepted[name] {
				changes = append(changes, Change[T]{File: name, Kind: ValidAgain, InForce: f.inForce, HasInForce: f.hasInForce})
			}
			f.reported = ""
		} else if msg := f.rejected.Error(); msg != f.reported {
			f.reported = msg
			changes = append(changes, Change[T]{File: name, Kind: Rejected, InForce: f.inForce, HasInForce: f.hasInForce,
				Restored: f.restored, Err: f.rejected})
		}
	}
	return changes
}

func (v *Versions[T]) claims(parsed T, has bool) []string {
	if !has || v.Claims == nil {
		return nil
	}
	return v.Claims(parsed)
}

// Len is the number of files.
func (v *Versions[T]) Len() int { return len(v.files) }

// InForce returns the versions in force, by file name.
func (v *Versions[T]) InForce() map[string]T {
	out := make(map[string]T, len(v.files))
	for name, f := range v.files {
		if f.hasInForce {
			out[name] = f.inForce
		}
	}
	return out
}

// InForceContents returns the contents the versions in force came from,
// and their digests, by file name: what Saved.Write saves and SaveKey
// identifies.
func (v *Versions[T]) InForceContents() (contents map[string][]byte, digests map[string][sha256.Size]byte) {
	contents, digests = map[string][]byte{}, map[string][sha256.Size]byte{}
	for name, f := range v.files {
		if f.hasInForce {
			contents[name], digests[name] = f.inForceContent, f.inForceDigest
		}
	}
	return contents, digests
}

// Status returns each file's version in force and why its current
// content is rejected, sorted by file name.
func (v *Versions[T]) Status() []Status[T] {
	status := make([]Status[T], 0, len(v.files))
	for _, name := range slices.Sorted(maps.Keys(v.files)) {
		f := v.files[name]
		status = append(status, Status[T]{File: name, InForce: f.inForce, HasInForce: f.hasInForce, Err: f.rejected})
	}
	return status
}

// Current returns a file's current content and what it parsed to, as
// kept: both are dropped when the content is rejected by Parse, so that a
// rejected file costs no memory beyond its version in force.
func (v *Versions[T]) Current(file string) (content []byte, parsed T, ok bool) {
	f := v.files[file]
	if f == nil {
		return nil, parsed, false
	}
	return f.content, f.parsed, true
}
