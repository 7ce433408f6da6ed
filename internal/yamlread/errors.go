// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"errors"
	"fmt"
)

var (
	// ErrSyntax is wrapped by the error for text that is not YAML.
	ErrSyntax = errors.New("YAML syntax error")

	// ErrUnsupported is wrapped by the error for YAML that this reader
	// does not read (package documentation).
	ErrUnsupported = errors.New("YAML not supported")

	// ErrTooManyNodes is wrapped by the error for a document with more
	// nodes than the reader was allowed.
	ErrTooManyNodes = errors.New("too many YAML nodes in a document")

	// ErrTooDeep is wrapped by the error for collections nested more
	// than MaxDepth deep.
	ErrTooDeep = errors.New("YAML collections nested too deep")
)

// Error is an error of the reader, at a position of the file.
type Error struct {
	// Line and Column are 1-based; Column counts characters.
	Line, Column int
	// Msg says what is wrong, for a person.
	Msg string
	// Err is ErrSyntax, ErrUnsupported, ErrTooManyNodes or ErrTooDeep.
	Err error
}

// Error formats as "line:column: message".
func (e *Error) Error() string { return fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg) }

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }
