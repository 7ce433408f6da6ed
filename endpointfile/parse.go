// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/internal/yamlread"
)

// Documents is what an endpoint file describes, in the order of the file.
type Documents struct {
	Endpoints  []endpoint.Endpoint
	Namespaces []endpoint.Namespace
	Nodes      []endpoint.Node
}

// Parse parses an endpoint file: one or more YAML documents, each a native
// Endpoint, a Pod, a Namespace, a Node or a List of those (kinds.go);
// empty documents are skipped. file is the file's name, for errors. The
// whole file is validated: the first error rejects it.
//
// The native Endpoint is strict: an unknown field is an error. The
// Kubernetes kinds are read as `kubectl get -o yaml` prints them: the
// fields that do not matter here (managedFields, spec.containers,
// status.conditions, ...) are skipped unread, and a Pod that has no
// endpoint (spec.hostNetwork, or status.phase Succeeded or Failed) is
// skipped. Names are validated as Kubernetes validates them, and label
// keys and values as Kubernetes label keys and values. A document of
// another kind, a missing name or address, an address that does not parse
// (or is unspecified, multicast or has a zone), a bad interface name, and
// two documents naming the same endpoint, namespace or node, or the same
// address, are errors.
//
// Memory is bounded by the content's size as for policy files: a document
// with more YAML nodes than the content's size allows (one per 4 bytes,
// plus 4096) is an error, found as the document is read.
//
// Possible errors: *FileError wrapping ErrInvalidFile.
func Parse(file string, content []byte) (Documents, error) {
	p := &parser{
		file:       file,
		size:       len(content),
		endpoints:  map[string]int{},
		addresses:  map[netip.Addr]addressUse{},
		namespaces: map[string]int{},
		nodes:      map[string]int{},
	}
	r := yamlread.NewReader(content, nodeBudget(len(content)))
	for {
		root, err := r.Next()
		if errors.Is(err, io.EOF) {
			return p.docs, nil
		}
		if err != nil {
			return Documents{}, p.syntaxError(err)
		}
		if root.IsNull() {
			continue
		}
		if err := p.document(root, ""); err != nil {
			return Documents{}, err
		}
	}
}

// addressUse is the endpoint an address of the file is for, and where.
type addressUse struct {
	id   string
	line int
}

type parser struct {
	file string
	// size is the file's, for the node budget's error.
	size int
	// current names the object being parsed, for errors ("" between
	// objects).
	current string

	// What the file has described so far, with the lines of the names,
	// to reject a second description.
	endpoints  map[string]int
	addresses  map[netip.Addr]addressUse
	namespaces map[string]int
	nodes      map[string]int

	docs Documents
}

// syntaxError turns the YAML reader's error into one with a position.
func (p *parser) syntaxError(err error) error {
	var yerr *yamlread.Error
	if !errors.As(err, &yerr) {
		return &FileError{File: p.file, Err: fmt.Errorf("%w: YAML: %v", ErrInvalidFile, err)}
	}
	if errors.Is(err, yamlread.ErrTooManyNodes) {
		return &FileError{File: p.file, Line: yerr.Line, Err: fmt.Errorf(
			"%w: more YAML values, lists and mappings in a document than a file of %d bytes may have (%d: one per %d bytes, plus %d)",
			ErrInvalidFile, p.size, nodeBudget(p.size), nodeBytes, nodeAllowance)}
	}
	return &FileError{File: p.file, Line: yerr.Line, Column: yerr.Column, Err: fmt.Errorf("%w: YAML: %s", ErrInvalidFile, yerr.Msg)}
}

// errorf is an error at n's position, in the object being parsed.
func (p *parser) errorf(n yamlread.Node, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if p.current != "" {
		msg = p.current + ": " + msg
	}
	return &FileError{File: p.file, Line: n.Line(), Column: n.Column(), Err: fmt.Errorf("%w: %s", ErrInvalidFile, msg)}
}

// mapping checks that n is a mapping (null, when optional, is the empty
// one) and, when allowed is given, that each of its keys is allowed.
func (p *parser) mapping(n yamlread.Node, what string, optional bool, allowed ...string) error {
	if optional && n.IsNull() {
		return nil
	}
	if n.Kind() != yamlread.Mapping {
		return p.errorf(n, "%s: want a mapping, got %s", what, yamlread.Describe(n))
	}
	if len(allowed) == 0 {
		return nil
	}
	for key := range n.Pairs() {
		if key.Kind() != yamlread.Scalar || !slices.Contains(allowed, key.Value()) {
			return p.errorf(key, "%s: unknown field %s, want one of %s", what, yamlread.Describe(key), strings.Join(allowed, ", "))
		}
	}
	return nil
}

// field returns the value of a field of a mapping n (which mapping has
// checked), if given and not null.
func field(n yamlread.Node, name string) (yamlread.Node, bool) {
	value, ok := n.Get(name)
	if !ok || value.IsNull() {
		return yamlread.Node{}, false
	}
	return value, true
}

// scalar returns a scalar's value; a collection or null is an error.
func (p *parser) scalar(n yamlread.Node, what string) (string, error) {
	if n.Kind() != yamlread.Scalar || n.IsNull() {
		return "", p.errorf(n, "%s: want a value, got %s", what, yamlread.Describe(n))
	}
	return n.Value(), nil
}

// str returns a string scalar's value: as in Kubernetes, a label or an
// annotation is a string, and `1` or `true` unquoted is not.
func (p *parser) str(n yamlread.Node, what string) (string, error) {
	if n.Kind() != yamlread.Scalar || n.Tag() != yamlread.TagStr {
		return "", p.errorf(n, "%s: want a string, got %s (quote it)", what, yamlread.Describe(n))
	}
	return n.Value(), nil
}

// list returns the items of a sequence; null is the empty list.
func (p *parser) list(n yamlread.Node, what string) ([]yamlread.Node, error) {
	if n.IsNull() {
		return nil, nil
	}
	if n.Kind() != yamlread.Sequence {
		return nil, p.errorf(n, "%s: want a list, got %s", what, yamlread.Describe(n))
	}
	items := make([]yamlread.Node, 0, n.Len())
	for _, item := range n.Items() {
		items = append(items, item)
	}
	return items, nil
}
