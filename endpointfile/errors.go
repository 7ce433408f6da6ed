// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"errors"
	"fmt"
)

// ErrInvalidFile is wrapped by every error that rejects an endpoint file
// for its content. It comes wrapped in a *FileError that names the file
// and the position.
var ErrInvalidFile = errors.New("invalid endpoint file")

// FileError is a rejected endpoint file, with the position in it that the
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
