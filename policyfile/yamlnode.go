// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"errors"

	"github.com/ipcache-agent/ipcache-agent/internal/yamlread"
)

// The parsers of every format read documents through the names in this
// file only, so that the YAML reader behind them is one choice, made here.
type node = yamlread.Node

const (
	mappingNode  = yamlread.Mapping
	sequenceNode = yamlread.Sequence
	scalarNode   = yamlread.Scalar
)

// isNull reports whether n is a null scalar (`~`, `null` or nothing).
func isNull(n node) bool { return n.IsNull() }

// isString reports whether n is a string scalar: quoted, or plain and
// neither a number, a boolean nor null (the YAML core schema). Kubernetes
// reads a field that takes a number or a string by this type, not by the
// characters.
func isString(n node) bool { return n.Kind() == scalarNode && n.Tag() == yamlread.TagStr }

// isBool reports whether n is a boolean scalar (`true`, `False`, ...,
// not quoted).
func isBool(n node) bool { return n.Kind() == scalarNode && n.Tag() == yamlread.TagBool }

// documentReader reads the documents of a file one at a time, so that only
// one document's tree is in memory at once.
type documentReader struct {
	r *yamlread.Reader
}

// newDocumentReader reads content; a document may have at most maxNodes
// nodes.
func newDocumentReader(content []byte, maxNodes int) *documentReader {
	return &documentReader{r: yamlread.NewReader(content, maxNodes)}
}

// next returns the root of the next document (a null scalar for an empty
// one), valid until the next call.
//
// Possible errors: io.EOF after the last document; a *yamlread.Error,
// which syntaxPosition reads.
func (r *documentReader) next() (node, error) { return r.r.Next() }

// syntaxPosition returns the position (line and column, 0 if unknown) and
// the message of an error of the reader, and whether it is for a
// document with more nodes than allowed.
func syntaxPosition(err error) (line, column int, msg string, tooManyNodes bool) {
	var yerr *yamlread.Error
	if !errors.As(err, &yerr) {
		return 0, 0, err.Error(), false
	}
	return yerr.Line, yerr.Column, yerr.Msg, errors.Is(err, yamlread.ErrTooManyNodes)
}
