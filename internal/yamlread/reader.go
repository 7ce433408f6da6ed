// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// MaxDepth is how deep collections may nest: far more than a policy or a
// Kubernetes manifest needs, and little enough that the reader's
// recursion is bounded.
const MaxDepth = 100

// maxKeyLength is the longest a key may be, in characters from its start
// to its ':', as in yaml.v3 (a longer one is not a key there).
const maxKeyLength = 1024

// Reader reads the documents of a file one at a time: a document's tree
// is in memory only until the next call of Next.
type Reader struct {
	s        string
	i        int
	line     int // 1-based line of i
	lineOff  int // offset of the line's start
	colOff   int // an offset on the line whose column is colN:
	colN     int // columns are counted in characters from there
	maxNodes int

	tree    tree
	scratch []byte
	keys    []uint32
	depth   int

	checked, started, afterEnd bool
	err                        error
}

// NewReader returns a reader of content; a document may have at most
// maxNodes nodes.
func NewReader(content []byte, maxNodes int) *Reader {
	r := &Reader{s: string(content), line: 1, maxNodes: maxNodes}
	if strings.HasPrefix(r.s, "\ufeff") {
		r.i, r.lineOff, r.colOff = 3, 3, 3
	}
	return r
}

// mark is a position: line and column, 1-based.
type mark struct{ line, col int }

// Next returns the root of the next document: a null scalar for an empty
// one. The nodes of the document before are no longer valid.
//
// Possible errors: io.EOF after the last document; an *Error wrapping
// ErrSyntax, ErrUnsupported, ErrTooManyNodes or ErrTooDeep, then the
// same error at every call.
func (r *Reader) Next() (Node, error) {
	if r.err != nil {
		return Node{}, r.err
	}
	if !r.checked {
		r.checked = true
		if err := r.checkCharacters(); err != nil {
			r.err = err
			return Node{}, err
		}
	}
	r.tree.reset()
	r.depth = 0
	root, err := r.document()
	if err != nil {
		r.err = err
		return Node{}, err
	}
	return Node{t: &r.tree, i: root}, nil
}

// checkCharacters rejects what yaml.v3 rejects before parsing (invalid
// UTF-8, control characters) and the line breaks of YAML 1.1 (NEL, LS,
// PS) and byte order marks inside the file, which YAML 1.2 does not have.
func (r *Reader) checkCharacters() error {
	line, lineOff := 1, 0
	for i := r.i; i < len(r.s); {
		c, size := utf8.DecodeRuneInString(r.s[i:])
		var msg string
		switch {
		case c == utf8.RuneError && size == 1:
			msg = "invalid UTF-8"
		case c == '\n' || c == '\r' && (i+1 == len(r.s) || r.s[i+1] != '\n'):
			line, lineOff = line+1, i+1
		case c == '\r' || c == '\t' || c >= 0x20 && c <= 0x7e:
		case c == 0x85 || c == 0x2028 || c == 0x2029:
			msg = fmt.Sprintf("line break %U is not supported, use \\n", c)
		case c == 0xfeff:
			msg = "byte order mark inside the file"
		case c < 0xa0 || c == 0xfffe || c == 0xffff:
			msg = fmt.Sprintf("control character %U is not allowed", c)
		}
		if msg != "" {
			return &Error{Line: line, Column: utf8.RuneCountInString(r.s[lineOff:i]) + 1, Msg: msg, Err: ErrSyntax}
		}
		i += size
	}
	return nil
}

func (r *Reader) eof() bool { return r.i >= len(r.s) }

// at returns the byte at offset j, 0 past the end.
func (r *Reader) at(j int) byte {
	if j < len(r.s) {
		return r.s[j]
	}
	return 0
}

func (r *Reader) isBreak(j int) bool { c := r.at(j); return c == '\n' || c == '\r' }

// blankz: a blank, a line break or the end at j.
func (r *Reader) blankz(j int) bool {
	c := r.at(j)
	return j >= len(r.s) || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

func (r *Reader) skipBreak() {
	if r.s[r.i] == '\r' && r.at(r.i+1) == '\n' {
		r.i++
	}
	r.i++
	r.line++
	r.lineOff, r.colOff, r.colN = r.i, r.i, 0
}

// col is the 0-based column of i, in characters.
func (r *Reader) col() int {
	if r.colOff < r.lineOff || r.colOff > r.i {
		r.colOff, r.colN = r.lineOff, 0
	}
	for j := r.colOff; j < r.i; j++ {
		if r.s[j]&0xc0 != 0x80 {
			r.colN++
		}
	}
	r.colOff = r.i
	return r.colN
}

// mark is the position of i.
func (r *Reader) mark() mark { return mark{r.line, r.col() + 1} }

// next is the position of the token at i: at the end, the start of the
// line after the last (where yaml.v3 puts the end of the stream).
func (r *Reader) next() mark {
	if r.eof() && r.i > r.lineOff {
		return mark{r.line + 1, 1}
	}
	return r.mark()
}

func (r *Reader) errAt(m mark, sentinel error, format string, args ...any) error {
	return &Error{Line: m.line, Column: m.col, Msg: fmt.Sprintf(format, args...), Err: sentinel}
}

func (r *Reader) errorf(sentinel error, format string, args ...any) error {
	return r.errAt(r.mark(), sentinel, format, args...)
}

// atDocMarker: "---" or "..." at the start of a line, then a blank or the
// end.
func (r *Reader) atDocMarker() bool {
	return r.i == r.lineOff && (strings.HasPrefix(r.s[r.i:], "---") || strings.HasPrefix(r.s[r.i:], "...")) && r.blankz(r.i+3)
}

func (r *Reader) atSeqEntry() bool { return r.at(r.i) == '-' && r.blankz(r.i+1) }

// freshLine: only blanks before i on its line.
func (r *Reader) freshLine() bool {
	for j := r.i - 1; j >= r.lineOff; j-- {
		if r.s[j] != ' ' && r.s[j] != '\t' {
			return false
		}
	}
	return true
}

// skip skips blanks, comments and line breaks and reports whether it
// crossed a line break. In the block context a tab may not indent a line
// nor follow an indicator ("- ", ": "), as in yaml.v3: tabsOK says
// whether one may be skipped on the current line.
func (r *Reader) skip(flow, tabsOK bool) (crossed bool, err error) {
	for r.i < len(r.s) {
		switch r.s[r.i] {
		case ' ':
			r.i++
		case '\t':
			if !flow && !tabsOK {
				return crossed, r.errorf(ErrSyntax, "tab character where indentation is read: indent with spaces")
			}
			r.i++
		case '#':
			for r.i < len(r.s) && !r.isBreak(r.i) {
				r.i++
			}
		case '\n', '\r':
			r.skipBreak()
			crossed = true
			tabsOK = false
		default:
			return crossed, nil
		}
	}
	return crossed, nil
}

// skipLine skips blanks and a comment, to the end of the line.
func (r *Reader) skipLine(what string) error {
	for r.i < len(r.s) && (r.s[r.i] == ' ' || r.s[r.i] == '\t') {
		r.i++
	}
	if r.at(r.i) == '#' && (r.i == 0 || r.s[r.i-1] == ' ' || r.s[r.i-1] == '\t') {
		for r.i < len(r.s) && !r.isBreak(r.i) {
			r.i++
		}
	}
	if !r.eof() && !r.isBreak(r.i) {
		return r.errorf(ErrSyntax, "unexpected %q after %s", r.s[r.i], what)
	}
	return nil
}

func (r *Reader) add(e entry) (uint32, error) {
	if int(r.tree.n) >= r.maxNodes {
		return 0, r.errAt(mark{int(e.line), int(e.col)}, ErrTooManyNodes, "more than %d nodes in a document", r.maxNodes)
	}
	return r.tree.add(e, len(r.s)/16), nil
}

func (r *Reader) addScalar(m mark, value string, tag Tag) (uint32, error) {
	i, err := r.add(entry{value: value, line: uint32(m.line), col: uint32(m.col), kind: Scalar, tag: tag})
	r.tree.at(i).end = i + 1
	return i, err
}

func (r *Reader) enter() error {
	r.depth++
	if r.depth > MaxDepth {
		return r.errorf(ErrTooDeep, "collections nested more than %d deep", MaxDepth)
	}
	return nil
}

// document reads what is before a document and the document.
func (r *Reader) document() (uint32, error) {
	version := false
	for {
		if _, err := r.skip(false, false); err != nil {
			return 0, err
		}
		switch {
		case r.eof():
			if version {
				return 0, r.errorf(ErrSyntax, "expected --- after the %%YAML directive")
			}
			return 0, io.EOF
		case r.i == r.lineOff && r.s[r.i] == '%':
			if r.started && !r.afterEnd {
				return 0, r.errorf(ErrSyntax, "a directive must follow the end of the document before (...)")
			}
			if err := r.directive(version); err != nil {
				return 0, err
			}
			version = true
			continue
		case r.atDocMarker() && r.s[r.i] == '.':
			if !r.started {
				return 0, r.errorf(ErrSyntax, "... (end of a document) before any document")
			}
			if version {
				return 0, r.errorf(ErrSyntax, "expected --- after the %%YAML directive")
			}
			r.i += 3
			if err := r.skipLine("..."); err != nil {
				return 0, err
			}
			r.afterEnd = true
			continue
		}
		break
	}
	explicit := r.atDocMarker()
	switch {
	case explicit:
		r.i += 3
	case version:
		return 0, r.errorf(ErrSyntax, "expected --- after the %%YAML directive")
	case r.started || r.afterEnd:
		return 0, r.errorf(ErrSyntax, "expected --- before another document")
	}
	r.started, r.afterEnd = true, false
	root := r.tree.n
	pl := place{parent: -1, noBlock: explicit, tabsOK: explicit}
	if err := r.blockNode(pl); err != nil {
		return 0, err
	}
	if _, err := r.skip(false, true); err != nil {
		return 0, err
	}
	if !r.eof() && !r.atDocMarker() {
		return 0, r.errorf(ErrSyntax, "unexpected %q after the document's content (a mapping key at the wrong indentation?)", r.s[r.i])
	}
	return root, nil
}

// directive reads "%YAML 1.1".
func (r *Reader) directive(seen bool) error {
	start := r.mark()
	end := r.i
	for end < len(r.s) && !r.blankz(end) {
		end++
	}
	name := r.s[r.i:end]
	switch name {
	case "%YAML":
	case "%TAG":
		return r.errAt(start, ErrUnsupported, "%%TAG directives are not supported")
	default:
		return r.errAt(start, ErrSyntax, "unknown directive %q", name)
	}
	if seen {
		return r.errAt(start, ErrSyntax, "a second %%YAML directive")
	}
	r.i = end
	for r.at(r.i) == ' ' || r.at(r.i) == '\t' {
		r.i++
	}
	end = r.i
	for end < len(r.s) && !r.blankz(end) {
		end++
	}
	if version := r.s[r.i:end]; version != "1.1" {
		// yaml.v3 reads 1.2 and takes no other version.
		return r.errorf(ErrUnsupported, "%%YAML version %q, want 1.1 (read as YAML 1.2)", version)
	}
	r.i = end
	return r.skipLine("the %YAML directive")
}

// place is where a block node is read.
type place struct {
	// parent is the column (0-based) of the enclosing block collection,
	// -1 for the root: a node on a later line must be right of it.
	parent int
	// noBlock: on the line of "---" or of ": ", where no block
	// collection may start.
	noBlock bool
	// indentless: a "- " at the parent's column starts a sequence (the
	// value of a block mapping).
	indentless bool
	// tabsOK: a tab may separate on the current line.
	tabsOK bool
	// empty is the position of a missing node; zero: where the next
	// token is.
	empty mark
}

func (r *Reader) addEmpty(pl place, m mark, tag Tag) error {
	if pl.empty.line != 0 && tag == 0 {
		m = pl.empty
	}
	t, err := scalarTag(tag, "", true)
	if err != nil {
		return r.errAt(m, ErrUnsupported, "%v", err)
	}
	_, err = r.addScalar(m, "", t)
	return err
}

// rightOf: the node at i, on a later line than its indicator, is inside
// pl (rather than a sibling of its parent or further out).
func (r *Reader) rightOf(pl place) bool {
	c := r.col()
	return c > pl.parent || c == pl.parent && pl.indentless && r.atSeqEntry()
}

// blockNode reads a node in the block context.
func (r *Reader) blockNode(pl place) error {
	crossed, err := r.skip(false, pl.tabsOK)
	if err != nil {
		return err
	}
	blockOK := crossed || !pl.noBlock
	if r.eof() || r.atDocMarker() || crossed && !r.rightOf(pl) {
		return r.addEmpty(pl, r.next(), 0)
	}
	var (
		tag     Tag
		tagMark mark
		tagLine bool // the tag is on the line of what follows: a scalar's or a key's
	)
	if r.s[r.i] == '!' {
		tagMark = r.mark()
		if tag, err = r.tagProperty(); err != nil {
			return err
		}
		crossed, err := r.skip(false, true)
		if err != nil {
			return err
		}
		if r.eof() || r.atDocMarker() || crossed && !r.rightOf(pl) {
			return r.addEmpty(pl, tagMark, tag)
		}
		tagLine = !crossed
		blockOK = blockOK || crossed
	}
	if err := r.noAnchorOrAlias(); err != nil {
		return err
	}
	here := r.mark()
	start := here
	if tag != 0 {
		start = tagMark
	}
	switch c := r.s[r.i]; {
	case r.atSeqEntry():
		if !blockOK || tagLine {
			return r.errorf(ErrSyntax, "a block sequence cannot start on this line: put its items on their own lines")
		}
		if tag != 0 && tag != TagSeq {
			return r.errAt(start, ErrUnsupported, "tag %v on a sequence", tag)
		}
		c := r.col()
		return r.blockSequence(c, start, pl.indentless && c == pl.parent)
	case c == '?' && r.blankz(r.i+1):
		return r.errorf(ErrUnsupported, "complex mapping keys (\"? \") are not supported")
	case c == ':' && r.blankz(r.i+1):
		return r.errorf(ErrUnsupported, "empty mapping keys are not supported")
	case c == '|' || c == '>':
		value, err := r.blockScalar(pl.parent)
		if err != nil {
			return err
		}
		t, err := scalarTag(tag, value, false)
		if err != nil {
			return r.errAt(start, ErrUnsupported, "%v", err)
		}
		_, err = r.addScalar(start, value, t)
		return err
	}
	node, err := r.scalarOrFlow(false, pl.parent)
	if err != nil {
		return err
	}
	if !r.keyFollows(node) {
		return r.applyTag(node.i, tag, start)
	}
	if !blockOK {
		return r.errorf(ErrSyntax, "a block mapping cannot start on this line: put its keys on their own lines")
	}
	if err := r.checkKey(node); err != nil {
		return err
	}
	if tagLine {
		// The tag is the key's, and the mapping starts where the key does.
		if err := r.applyTag(node.i, tag, tagMark); err != nil {
			return err
		}
		return r.blockMapping(node.i, tagMark.col-1, tagMark, 0)
	}
	return r.blockMapping(node.i, here.col-1, start, tag)
}

// read is a node just read by scalarOrFlow.
type read struct {
	i                  uint32
	scalar             bool
	start              mark
	startLine, endLine int
}

// keyFollows: a value indicator follows the node on its last line.
func (r *Reader) keyFollows(n read) bool {
	if r.line != n.endLine {
		return false
	}
	for r.at(r.i) == ' ' || r.at(r.i) == '\t' {
		r.i++
	}
	return r.at(r.i) == ':' && r.blankz(r.i+1)
}

// checkKey rejects keys yaml.v3 does not take for keys, and collections
// as keys.
func (r *Reader) checkKey(n read) error {
	switch {
	case !n.scalar:
		return r.errAt(n.start, ErrUnsupported, "a collection as a mapping key is not supported")
	case n.startLine != n.endLine:
		return r.errAt(n.start, ErrSyntax, "a mapping key must be on one line")
	case r.col()-(n.start.col-1) > maxKeyLength:
		return r.errAt(n.start, ErrSyntax, "a mapping key longer than %d characters", maxKeyLength)
	}
	return nil
}

// applyTag gives node i its explicit tag (if any) and position.
func (r *Reader) applyTag(i uint32, tag Tag, start mark) error {
	e := r.tree.at(i)
	if tag != 0 {
		switch {
		case e.kind == Mapping && tag != TagMap, e.kind == Sequence && tag != TagSeq:
			return r.errAt(start, ErrUnsupported, "tag %v on a %s", tag, map[Kind]string{Mapping: "mapping", Sequence: "sequence"}[e.kind])
		case e.kind == Scalar:
			t, err := scalarTag(tag, e.value, false)
			if err != nil {
				return r.errAt(start, ErrUnsupported, "%v", err)
			}
			e.tag = t
		}
	}
	e.line, e.col = uint32(start.line), uint32(start.col)
	return nil
}

// scalarTag is the tag of a scalar of value with the explicit tag (0 for
// none: value is then a plain scalar's if plain).
func scalarTag(tag Tag, value string, plain bool) (Tag, error) {
	switch tag {
	case 0:
		if plain {
			return resolvePlain(value), nil
		}
		return TagStr, nil
	case TagStr:
		return TagStr, nil
	case TagMap, TagSeq:
		return 0, fmt.Errorf("tag %v on a scalar", tag)
	}
	resolved := resolvePlain(value)
	if resolved == tag || tag == TagFloat && resolved == TagInt {
		return tag, nil
	}
	return 0, fmt.Errorf("%q is not a %v", value, tag)
}
