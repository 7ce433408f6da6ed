// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"iter"
	"strconv"
)

// Kind is what a node is.
type Kind uint8

const (
	// Scalar is a value: Node.Value and Node.Tag say which.
	Scalar Kind = iota + 1
	// Mapping has keys and values, in the order of the file (Node.Pairs).
	Mapping
	// Sequence has items (Node.Items).
	Sequence
)

// Tag is the resolved tag of a node: a scalar's by the core schema (as
// yaml.v3 resolves it) or its explicit tag; a collection's by its kind.
type Tag uint8

// The tags: those of the core schema, and yaml.v3's timestamp (a plain
// scalar such as 2001-12-14).
const (
	TagStr Tag = iota + 1
	TagNull
	TagBool
	TagInt
	TagFloat
	TagTimestamp
	TagMap
	TagSeq
)

// String is the tag as YAML writes it ("!!str").
func (t Tag) String() string {
	switch t {
	case TagStr:
		return "!!str"
	case TagNull:
		return "!!null"
	case TagBool:
		return "!!bool"
	case TagInt:
		return "!!int"
	case TagFloat:
		return "!!float"
	case TagTimestamp:
		return "!!timestamp"
	case TagMap:
		return "!!map"
	case TagSeq:
		return "!!seq"
	}
	return "!!unknown"
}

// entry is a node as stored: the nodes of a document are in pre-order,
// a collection's descendants right after it, up to end.
type entry struct {
	value     string
	line, col uint32
	end       uint32
	kind      Kind
	tag       Tag
}

// chunkLen is the number of entries of a chunk: chunks never move, so
// growing a document costs no copies, and a small document allocates
// only the first chunk, which grows up to chunkLen.
const (
	chunkShift = 10
	chunkLen   = 1 << chunkShift
)

// tree holds the entries of the current document.
type tree struct {
	chunks [][]entry
	n      uint32
}

func (t *tree) at(i uint32) *entry { return &t.chunks[i>>chunkShift][i&(chunkLen-1)] }

func (t *tree) reset() {
	for i, c := range t.chunks {
		clear(c) // drop the values of the previous document
		t.chunks[i] = c[:0]
	}
	t.n = 0
}

// add appends e; sizeHint is the first chunk's capacity.
func (t *tree) add(e entry, sizeHint int) uint32 {
	c := int(t.n >> chunkShift)
	if c == len(t.chunks) {
		capacity := chunkLen
		if c == 0 {
			capacity = min(chunkLen, max(16, sizeHint))
		}
		t.chunks = append(t.chunks, make([]entry, 0, capacity))
	}
	t.chunks[c] = append(t.chunks[c], e)
	t.n++
	return t.n - 1
}

// Node is a node of the document Reader.Next returned last; it is valid
// until the next call of Next. The zero Node is no node.
type Node struct {
	t *tree
	i uint32
}

func (n Node) e() *entry { return n.t.at(n.i) }

// Kind is the node's kind.
func (n Node) Kind() Kind { return n.e().kind }

// Tag is the node's resolved tag.
func (n Node) Tag() Tag { return n.e().tag }

// Value is a scalar's value ("" for a collection).
func (n Node) Value() string { return n.e().value }

// Line is the node's 1-based line.
func (n Node) Line() int { return int(n.e().line) }

// Column is the node's 1-based column, in characters.
func (n Node) Column() int { return int(n.e().col) }

// IsNull reports whether n is a null scalar (`~`, `null` or nothing).
func (n Node) IsNull() bool { e := n.e(); return e.kind == Scalar && e.tag == TagNull }

// Len is the number of a sequence's items or a mapping's pairs.
func (n Node) Len() int {
	count := 0
	for range n.children() {
		count++
	}
	if n.Kind() == Mapping {
		count /= 2
	}
	return count
}

func (n Node) children() iter.Seq[Node] {
	return func(yield func(Node) bool) {
		end := n.e().end
		for i := n.i + 1; i < end; i = n.t.at(i).end {
			if !yield(Node{t: n.t, i: i}) {
				return
			}
		}
	}
}

// Items yields a sequence's items with their indexes; nothing for other
// kinds.
func (n Node) Items() iter.Seq2[int, Node] {
	return func(yield func(int, Node) bool) {
		if n.Kind() != Sequence {
			return
		}
		i := 0
		for child := range n.children() {
			if !yield(i, child) {
				return
			}
			i++
		}
	}
}

// Pairs yields a mapping's keys and values in the order of the file;
// nothing for other kinds.
func (n Node) Pairs() iter.Seq2[Node, Node] {
	return func(yield func(Node, Node) bool) {
		if n.Kind() != Mapping {
			return
		}
		var key Node
		for child := range n.children() {
			if key.t == nil {
				key = child
				continue
			}
			if !yield(key, child) {
				return
			}
			key = Node{}
		}
	}
}

// Get returns the value of a mapping's key (a scalar key, compared by its
// value), and whether the mapping has it; nothing for other kinds. The
// reader rejects a key given twice, so there is one value at most.
func (n Node) Get(key string) (Node, bool) {
	for k, v := range n.Pairs() {
		if k.Kind() == Scalar && k.Value() == key {
			return v, true
		}
	}
	return Node{}, false
}

// Describe names what a node is, for an error about it: "a mapping", "a
// list", "nothing" for null, or a scalar's value, quoted.
func Describe(n Node) string {
	switch n.Kind() {
	case Mapping:
		return "a mapping"
	case Sequence:
		return "a list"
	}
	if n.IsNull() {
		return "nothing"
	}
	return strconv.Quote(n.Value())
}
