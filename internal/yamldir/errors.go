// SPDX-License-Identifier: Apache-2.0

package yamldir

import "errors"

// The errors of a file of the directory that could not be read. Each is
// wrapped in an error whose message names the directory's kind of file
// (Dir.What): "symlink target is outside the policy directory, not read".
var (
	// ErrOutsideDirectory is a file that is a symlink whose resolution
	// leaves the directory: a target outside it, an absolute target, or a
	// path through a symlinked directory outside it. Such a file is not
	// opened.
	ErrOutsideDirectory = errors.New("symlink target is outside the directory, not read")

	// ErrNotRegular is a file that is neither a regular file nor a
	// symlink to one (a FIFO could block the reader).
	ErrNotRegular = errors.New("not a regular file")

	// ErrTooLarge is a file larger than Dir.MaxSize.
	ErrTooLarge = errors.New("file too large")
)

// ErrCorruptSaved is a saved file of the versions in force (Saved) that
// cannot be restored. It comes wrapped in an error that says what the
// file holds ("corrupt saved policies in force").
var ErrCorruptSaved = errors.New("corrupt saved versions in force")

// kindError is a sentinel with a message that names the kind of file.
type kindError struct {
	msg      string
	sentinel error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.sentinel }
