// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"errors"
	"fmt"
)

// ErrInvalidPolicy is wrapped by every error that rejects a policy file
// for its content. It comes wrapped in a *FileError that names the file
// (and the position, where there is one).
var ErrInvalidPolicy = errors.New("invalid policy file")

// FileError is a rejected policy file, with the position in it that the
// error is about (Line and Column are 1-based, 0 when unknown).
type FileError struct {
	File         string
	Line, Column int
	Err          error
}

// Error formats as "file:line:column: error", as compilers do.
func (e *FileError) Error() string {
	switch {
	case e.Line == 0:
		return fmt.Sprintf("%s: %v", e.File, e.Err)
	case e.Column == 0:
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d:%d: %v", e.File, e.Line, e.Column, e.Err)
}

// Unwrap returns the error the file was rejected for.
func (e *FileError) Unwrap() error { return e.Err }

// Warning is something a valid policy file says that the agent reads
// otherwise than written, at a position in the file (Line and Column are
// 1-based).
type Warning struct {
	File         string
	Line, Column int
	Msg          string
}

// String formats as "file:line:column: message", as FileError does.
func (w Warning) String() string {
	return fmt.Sprintf("%s:%d:%d: %s", w.File, w.Line, w.Column, w.Msg)
}
