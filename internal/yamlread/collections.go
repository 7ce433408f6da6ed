// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"slices"
	"strings"
)

// blockSequence reads the items of a block sequence whose "- " are at
// column c; indentless: it is a mapping's value at the mapping's column.
func (r *Reader) blockSequence(c int, start mark, indentless bool) error {
	if err := r.enter(); err != nil {
		return err
	}
	seq, err := r.add(entry{line: uint32(start.line), col: uint32(start.col), kind: Sequence, tag: TagSeq})
	if err != nil {
		return err
	}
	for {
		r.i++ // '-'
		if err := r.blockNode(place{parent: c, empty: r.mark()}); err != nil {
			return err
		}
		if more, err := r.nextLine("a sequence item"); !more || err != nil {
			if err != nil {
				return err
			}
			break
		}
		if at := r.col(); at < c || at == c && indentless && !r.atSeqEntry() {
			break
		} else if at > c || !r.atSeqEntry() {
			return r.errorf(ErrSyntax, "bad indentation: expected \"- \" at column %d", c+1)
		}
	}
	r.tree.at(seq).end = r.tree.n
	r.depth--
	return nil
}

// blockMapping reads a block mapping whose first key, at column c, is
// node key (a scalar, the last node read), and the ':' after it is at i.
func (r *Reader) blockMapping(key uint32, c int, start mark, tag Tag) error {
	if err := r.enter(); err != nil {
		return err
	}
	// The mapping goes before its first key.
	k := *r.tree.at(key)
	if _, err := r.add(k); err != nil {
		return err
	}
	r.tree.at(key + 1).end = key + 2
	*r.tree.at(key) = entry{line: uint32(start.line), col: uint32(start.col), kind: Mapping, tag: TagMap}
	if tag != 0 && tag != TagMap {
		return r.errAt(start, ErrUnsupported, "tag %v on a mapping", tag)
	}
	for {
		r.i++ // ':'
		if err := r.blockNode(place{parent: c, noBlock: true, indentless: true, empty: r.mark()}); err != nil {
			return err
		}
		if more, err := r.nextLine("a mapping value"); !more || err != nil {
			if err != nil {
				return err
			}
			break
		}
		if at := r.col(); at < c {
			break
		} else if at > c {
			return r.errorf(ErrSyntax, "bad indentation: expected a key at column %d", c+1)
		}
		if err := r.blockKey(); err != nil {
			return err
		}
	}
	r.tree.at(key).end = r.tree.n
	r.depth--
	return r.checkDuplicates(key)
}

// nextLine moves to the next token after an entry of a block collection,
// which must be on a later line; it reports false at the end of the
// document.
func (r *Reader) nextLine(after string) (bool, error) {
	if _, err := r.skip(false, true); err != nil {
		return false, err
	}
	if r.eof() || r.atDocMarker() {
		return false, nil
	}
	if !r.freshLine() {
		return false, r.errorf(ErrSyntax, "unexpected %q after %s", r.s[r.i], after)
	}
	return true, nil
}

// blockKey reads a key of a block mapping after the first, and stops at
// its ':'.
func (r *Reader) blockKey() error {
	var tag Tag
	start := r.mark()
	if r.s[r.i] == '!' {
		var err error
		if tag, err = r.tagProperty(); err != nil {
			return err
		}
		for r.at(r.i) == ' ' || r.at(r.i) == '\t' {
			r.i++
		}
	}
	if err := r.noAnchorOrAlias(); err != nil {
		return err
	}
	switch c := r.at(r.i); {
	case r.atSeqEntry():
		return r.errorf(ErrSyntax, "expected a mapping key, found a sequence item (\"- \")")
	case c == '?' && r.blankz(r.i+1):
		return r.errorf(ErrUnsupported, "complex mapping keys (\"? \") are not supported")
	case c == ':' && r.blankz(r.i+1):
		return r.errorf(ErrUnsupported, "empty mapping keys are not supported")
	case c == '|' || c == '>' || r.eof() || r.isBreak(r.i) || c == '#':
		return r.errorf(ErrSyntax, "expected a mapping key")
	}
	node, err := r.scalarOrFlow(false, start.col-1)
	if err != nil {
		return err
	}
	if !r.keyFollows(node) {
		return r.errAt(node.start, ErrSyntax, "expected ':' after a mapping key")
	}
	if err := r.checkKey(node); err != nil {
		return err
	}
	return r.applyTag(node.i, tag, start)
}

// checkDuplicates rejects a mapping with a key given twice.
func (r *Reader) checkDuplicates(m uint32) error {
	keys := r.keys[:0]
	end := r.tree.at(m).end
	for i, isKey := m+1, true; i < end; i, isKey = r.tree.at(i).end, !isKey {
		if isKey {
			keys = append(keys, i)
		}
	}
	r.keys = keys
	value := func(i uint32) string { return r.tree.at(i).value }
	slices.SortFunc(keys, func(a, b uint32) int {
		if c := strings.Compare(value(a), value(b)); c != 0 {
			return c
		}
		return int(a) - int(b)
	})
	dup, first := uint32(0), uint32(0)
	for j := 1; j < len(keys); j++ {
		if value(keys[j]) == value(keys[j-1]) && (dup == 0 || keys[j] < dup) {
			dup, first = keys[j], keys[j-1]
		}
	}
	if dup == 0 {
		return nil
	}
	d := r.tree.at(dup)
	return r.errAt(mark{int(d.line), int(d.col)}, ErrSyntax, "mapping key %q given twice (first at line %d)", d.value, r.tree.at(first).line)
}

// flowCollection reads a flow sequence or mapping at i.
func (r *Reader) flowCollection() error {
	if err := r.enter(); err != nil {
		return err
	}
	start := r.mark()
	seq := r.s[r.i] == '['
	kind, tag, closing := Mapping, TagMap, byte('}')
	if seq {
		kind, tag, closing = Sequence, TagSeq, ']'
	}
	coll, err := r.add(entry{line: uint32(start.line), col: uint32(start.col), kind: kind, tag: tag})
	if err != nil {
		return err
	}
	r.i++
	for first := true; ; first = false {
		if err := r.flowSkip(); err != nil {
			return err
		}
		if r.s[r.i] == closing {
			break
		}
		if !first {
			if r.s[r.i] != ',' {
				return r.errorf(ErrSyntax, "expected ',' or '%c' in a flow collection", closing)
			}
			r.i++
			if err := r.flowSkip(); err != nil {
				return err
			}
			if r.s[r.i] == closing {
				break
			}
		}
		switch c := r.s[r.i]; {
		case c == '?':
			return r.errorf(ErrUnsupported, "complex mapping keys (\"?\") are not supported")
		case c == ':':
			return r.errorf(ErrUnsupported, "empty mapping keys are not supported")
		}
		key, err := r.flowNode()
		if err != nil {
			return err
		}
		line := r.line
		if err := r.flowSkip(); err != nil {
			return err
		}
		if r.s[r.i] != ':' || r.line != line || key.startLine != line {
			if !seq {
				if !key.scalar {
					return r.errAt(key.start, ErrUnsupported, "a collection as a mapping key is not supported")
				}
				// A key without a value.
				if _, err := r.addScalar(r.mark(), "", TagNull); err != nil {
					return err
				}
			}
			continue
		}
		if err := r.checkKey(key); err != nil {
			return err
		}
		pair := key.i
		if seq {
			// A single pair: a mapping goes before its key.
			k := *r.tree.at(key.i)
			if _, err := r.add(k); err != nil {
				return err
			}
			r.tree.at(pair + 1).end = pair + 2
			*r.tree.at(pair) = entry{line: k.line, col: k.col, kind: Mapping, tag: TagMap}
		}
		colon := r.mark()
		r.i++
		if err := r.flowSkip(); err != nil {
			return err
		}
		if c := r.s[r.i]; c == ',' || c == closing {
			at := r.mark()
			if seq {
				at = colon
			}
			if _, err := r.addScalar(at, "", TagNull); err != nil {
				return err
			}
		} else if _, err := r.flowNode(); err != nil {
			return err
		}
		if seq {
			r.tree.at(pair).end = r.tree.n
		}
	}
	r.i++ // the closing bracket
	r.tree.at(coll).end = r.tree.n
	r.depth--
	if !seq {
		return r.checkDuplicates(coll)
	}
	return nil
}

// flowSkip skips to the next token inside a flow collection.
func (r *Reader) flowSkip() error {
	if _, err := r.skip(true, true); err != nil {
		return err
	}
	switch {
	case r.eof():
		return r.errorf(ErrSyntax, "unterminated flow collection: the file ends before its closing bracket")
	case r.atDocMarker():
		return r.errorf(ErrSyntax, "document marker inside a flow collection")
	}
	return nil
}

// flowNode reads a node inside a flow collection.
func (r *Reader) flowNode() (read, error) {
	start := r.mark()
	var tag Tag
	if r.s[r.i] == '!' {
		var err error
		if tag, err = r.tagProperty(); err != nil {
			return read{}, err
		}
		if err := r.flowSkip(); err != nil {
			return read{}, err
		}
		if c := r.s[r.i]; c == ',' || c == ']' || c == '}' || c == ':' {
			t, err := scalarTag(tag, "", true)
			if err != nil {
				return read{}, r.errAt(start, ErrUnsupported, "%v", err)
			}
			i, err := r.addScalar(start, "", t)
			return read{i: i, scalar: true, start: start, startLine: start.line, endLine: start.line}, err
		}
	}
	if err := r.noAnchorOrAlias(); err != nil {
		return read{}, err
	}
	switch c := r.s[r.i]; {
	case c == '|' || c == '>':
		return read{}, r.errorf(ErrSyntax, "a block scalar cannot be inside a flow collection")
	case c == '-' && r.blankz(r.i+1):
		return read{}, r.errorf(ErrSyntax, "a block sequence item (\"- \") cannot be inside a flow collection")
	case c == ',' || c == ']' || c == '}':
		return read{}, r.errorf(ErrSyntax, "expected a value before %q", c)
	}
	node, err := r.scalarOrFlow(true, -1)
	if err != nil {
		return read{}, err
	}
	if err := r.applyTag(node.i, tag, start); err != nil {
		return read{}, err
	}
	node.start = start
	node.startLine = start.line
	return node, nil
}

// tagProperty reads an explicit tag: one of the core schema's.
func (r *Reader) tagProperty() (Tag, error) {
	start := r.mark()
	end := r.i
	for end < len(r.s) && !r.blankz(end) && !strings.ContainsRune(",[]{}", rune(r.s[end])) {
		end++
	}
	name := r.s[r.i:end]
	tag, ok := explicitTag(name)
	if !ok {
		return 0, r.errAt(start, ErrUnsupported, "tag %q is not supported (only !!str, !!int, !!bool, !!null, !!float, !!map and !!seq)", name)
	}
	if !r.blankz(end) {
		return 0, r.errAt(start, ErrSyntax, "expected a blank after the tag %s", name)
	}
	r.i = end
	return tag, nil
}

func (r *Reader) noAnchorOrAlias() error {
	switch r.at(r.i) {
	case '&':
		return r.errorf(ErrUnsupported, "anchors (&) and aliases are not supported")
	case '*':
		return r.errorf(ErrUnsupported, "aliases (*) are not supported")
	}
	return nil
}
