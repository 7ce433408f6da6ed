// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"strings"
	"unicode/utf8"
)

// scalarOrFlow reads a quoted or plain scalar or a flow collection at i;
// parent is the column of the enclosing block collection (a plain
// scalar's lines must be right of it in the block context).
func (r *Reader) scalarOrFlow(flow bool, parent int) (read, error) {
	start := r.mark()
	n := read{start: start, startLine: start.line, scalar: true}
	var (
		value string
		tag   = TagStr
		err   error
	)
	switch c := r.s[r.i]; {
	case c == '[' || c == '{':
		n.scalar = false
		n.i = r.tree.n
		if err := r.flowCollection(); err != nil {
			return read{}, err
		}
		n.endLine = r.line
		return n, nil
	case c == '"' || c == '\'':
		if value, err = r.quoted(); err != nil {
			return read{}, err
		}
		n.endLine = r.line
	default:
		if err := r.plainStart(flow); err != nil {
			return read{}, err
		}
		if value, n.endLine, err = r.plain(flow, parent); err != nil {
			return read{}, err
		}
		if value == "<<" {
			return read{}, r.errAt(start, ErrUnsupported, "merge keys (<<) are not supported")
		}
		tag = resolvePlain(value)
	}
	n.i, err = r.addScalar(start, value, tag)
	return n, err
}

// plainStart rejects the indicators that cannot start a plain scalar.
func (r *Reader) plainStart(flow bool) error {
	c := r.s[r.i]
	switch c {
	case '-':
		if r.at(r.i+1) != ' ' && r.at(r.i+1) != '\t' {
			return nil
		}
	case '?', ':':
		if !flow && !r.blankz(r.i+1) {
			return nil
		}
	case ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`':
	default:
		return nil
	}
	return r.errorf(ErrSyntax, "%q cannot start a plain scalar: quote the value", c)
}

// decoder builds a scalar's value: a substring of the content until the
// value differs from its text, then a copy.
type decoder struct {
	r       *Reader
	start   int
	decoded bool
}

// differ starts the copy with the text before offset upTo.
func (d *decoder) differ(upTo int) {
	if !d.decoded {
		d.r.scratch = append(d.r.scratch[:0], d.r.s[d.start:upTo]...)
		d.decoded = true
	}
}

func (d *decoder) appendText(from, to int) {
	if d.decoded {
		d.r.scratch = append(d.r.scratch, d.r.s[from:to]...)
	}
}

func (d *decoder) appendByte(c byte) { d.r.scratch = append(d.r.scratch, c) }

// fold appends what line breaks become: one space for a single break,
// else a newline per break after the first.
func (d *decoder) fold(breaks int) {
	if breaks == 1 {
		d.appendByte(' ')
	}
	for range breaks - 1 {
		d.appendByte('\n')
	}
}

func (d *decoder) value(end int) string {
	if d.decoded {
		return string(d.r.scratch)
	}
	return d.r.s[d.start:end]
}

// plain reads a plain scalar, and returns it and its last line. It stops
// at ": ", at " #", in the flow context at the flow indicators, and at a
// line not right of parent in the block context.
func (r *Reader) plain(flow bool, parent int) (string, int, error) {
	d := decoder{r: r, start: r.i}
	end, endLine := r.i, r.line
	for {
		if r.atDocMarker() || r.at(r.i) == '#' {
			break
		}
		word := r.i
		for !r.blankz(r.i) {
			c := r.s[r.i]
			if c == ':' && r.blankz(r.i+1) || flow && strings.IndexByte(",?[]{}", c) >= 0 {
				break
			}
			r.i++
		}
		if r.i == word {
			break
		}
		d.appendText(word, r.i)
		end, endLine = r.i, r.line
		if r.eof() || !r.blankz(r.i) {
			break
		}
		// Blanks and line breaks: kept as they are within a line, folded
		// across lines.
		breaks := 0
		for !r.eof() && r.blankz(r.i) {
			if r.isBreak(r.i) {
				r.skipBreak()
				breaks++
			} else if r.s[r.i] == '\t' && breaks > 0 && !flow {
				return "", 0, r.errorf(ErrSyntax, "tab character where indentation is read: indent with spaces")
			} else {
				r.i++
			}
		}
		if breaks > 0 && !flow && r.col() <= parent {
			break
		}
		if r.eof() || r.atDocMarker() || r.s[r.i] == '#' || r.s[r.i] == ':' && r.blankz(r.i+1) ||
			flow && strings.IndexByte(",?[]{}", r.s[r.i]) >= 0 {
			break
		}
		if breaks > 0 {
			d.differ(end)
			d.fold(breaks)
		} else {
			d.appendText(end, r.i)
		}
	}
	return d.value(end), endLine, nil
}

// quoted reads a single- or double-quoted scalar.
func (r *Reader) quoted() (string, error) {
	start := r.mark()
	q := r.s[r.i]
	r.i++
	d := decoder{r: r, start: r.i}
	for {
		if r.atDocMarker() {
			return "", r.errorf(ErrSyntax, "document marker inside a quoted scalar")
		}
		if r.eof() {
			return "", r.errAt(start, ErrSyntax, "unterminated quoted scalar: the file ends before its closing quote")
		}
		escapedBreak := false
		for !r.blankz(r.i) {
			c := r.s[r.i]
			if c == q {
				if q == '\'' && r.at(r.i+1) == '\'' {
					d.differ(r.i)
					d.appendByte('\'')
					r.i += 2
					continue
				}
				break
			}
			if q == '"' && c == '\\' {
				d.differ(r.i)
				if r.isBreak(r.i + 1) {
					r.i++
					r.skipBreak()
					escapedBreak = true
					break
				}
				if err := r.escape(); err != nil {
					return "", err
				}
				continue
			}
			_, size := utf8.DecodeRuneInString(r.s[r.i:])
			d.appendText(r.i, r.i+size)
			r.i += size
		}
		if r.at(r.i) == q {
			break
		}
		// Blanks and line breaks.
		blanks, breaks := r.i, 0
		for !r.eof() && r.blankz(r.i) {
			if r.isBreak(r.i) {
				if breaks == 0 && !escapedBreak {
					d.differ(blanks)
				}
				r.skipBreak()
				breaks++
			} else {
				r.i++
			}
		}
		switch {
		case escapedBreak:
			for range breaks {
				d.appendByte('\n')
			}
		case breaks > 0:
			d.fold(breaks)
		default:
			d.appendText(blanks, r.i)
		}
	}
	value := d.value(r.i)
	r.i++ // the closing quote
	return value, nil
}

// escape decodes the escape sequence at i.
func (r *Reader) escape() error {
	start := r.mark()
	c := r.at(r.i + 1)
	if s := simpleEscape(c); s != "" {
		r.scratch = append(r.scratch, s...)
		r.i += 2
		return nil
	}
	digits := strings.IndexByte("..x.u...U", c)
	if c == '.' || digits < 0 {
		return r.errAt(start, ErrSyntax, "unknown escape \\%c in a double-quoted scalar", c)
	}
	var code rune
	for k := range digits {
		h := r.at(r.i + 2 + k)
		switch {
		case h >= '0' && h <= '9':
			code = code<<4 | rune(h-'0')
		case h >= 'a' && h <= 'f':
			code = code<<4 | rune(h-'a'+10)
		case h >= 'A' && h <= 'F':
			code = code<<4 | rune(h-'A'+10)
		default:
			return r.errAt(start, ErrSyntax, "escape \\%c needs %d hexadecimal digits", c, digits)
		}
	}
	if code >= 0xd800 && code <= 0xdfff || code > 0x10ffff {
		return r.errAt(start, ErrSyntax, "escape of an invalid Unicode character")
	}
	r.scratch = utf8.AppendRune(r.scratch, code)
	r.i += 2 + digits
	return nil
}

// blockScalar reads a literal (|) or folded (>) block scalar; parent is
// the column of the enclosing block collection.
func (r *Reader) blockScalar(parent int) (string, error) {
	literal := r.s[r.i] == '|'
	r.i++
	chomp, increment := 0, 0
	for range 2 {
		switch c := r.at(r.i); {
		case (c == '+' || c == '-') && chomp == 0:
			chomp = map[byte]int{'+': 1, '-': -1}[c]
			r.i++
		case c == '0':
			return "", r.errorf(ErrSyntax, "indentation indicator 0 in a block scalar, want 1 to 9")
		case c >= '1' && c <= '9' && increment == 0:
			increment = int(c - '0')
			r.i++
		}
	}
	for r.at(r.i) == ' ' || r.at(r.i) == '\t' {
		r.i++
	}
	if r.at(r.i) == '#' {
		for !r.eof() && !r.isBreak(r.i) {
			r.i++
		}
	}
	if !r.eof() && !r.isBreak(r.i) {
		return "", r.errorf(ErrSyntax, "expected a comment or a line break after the block scalar indicator")
	}
	if !r.eof() {
		r.skipBreak()
	}
	indent := 0
	if increment > 0 {
		indent = max(parent, 0) + increment
	}
	r.scratch = r.scratch[:0]
	trailing, maxIndent := 0, 0
	// breaks skips the indentation and the empty lines.
	breaks := func() error {
		for {
			for (indent == 0 || r.i-r.lineOff < indent) && r.at(r.i) == ' ' {
				r.i++
			}
			maxIndent = max(maxIndent, r.i-r.lineOff)
			if (indent == 0 || r.i-r.lineOff < indent) && r.at(r.i) == '\t' {
				return r.errorf(ErrSyntax, "tab character where indentation is read: indent with spaces")
			}
			if !r.isBreak(r.i) {
				return nil
			}
			r.skipBreak()
			trailing++
		}
	}
	if err := breaks(); err != nil {
		return "", err
	}
	if indent == 0 {
		indent = max(maxIndent, parent+1, 1)
		if at := r.i - r.lineOff; !r.eof() && at < indent && at > parent && maxIndent > at {
			return "", r.errorf(ErrSyntax, "an empty line of the block scalar is indented more than its first line")
		}
	}
	leadingBreak, leadingBlank := false, false
	for r.i-r.lineOff == indent && !r.eof() {
		trailingBlank := r.s[r.i] == ' ' || r.s[r.i] == '\t'
		if !literal && leadingBreak && !leadingBlank && !trailingBlank {
			if trailing == 0 {
				r.scratch = append(r.scratch, ' ')
			}
		} else if leadingBreak {
			r.scratch = append(r.scratch, '\n')
		}
		leadingBreak = false
		for range trailing {
			r.scratch = append(r.scratch, '\n')
		}
		trailing = 0
		leadingBlank = trailingBlank
		from := r.i
		for !r.eof() && !r.isBreak(r.i) {
			r.i++
		}
		r.scratch = append(r.scratch, r.s[from:r.i]...)
		if r.eof() {
			break
		}
		r.skipBreak()
		leadingBreak = true
		if err := breaks(); err != nil {
			return "", err
		}
	}
	if chomp != -1 && leadingBreak {
		r.scratch = append(r.scratch, '\n')
	}
	if chomp == 1 {
		for range trailing {
			r.scratch = append(r.scratch, '\n')
		}
	}
	return string(r.scratch), nil
}

// simpleEscape is what \c stands for in a double-quoted scalar, "" if
// it is not a one-character escape.
func simpleEscape(c byte) string {
	switch c {
	case '0':
		return "\x00"
	case 'a':
		return "\a"
	case 'b':
		return "\b"
	case 't', '\t':
		return "\t"
	case 'n':
		return "\n"
	case 'v':
		return "\v"
	case 'f':
		return "\f"
	case 'r':
		return "\r"
	case 'e':
		return "\x1b"
	case ' ', '"', '\'', '\\':
		return string(rune(c))
	case 'N':
		return "\u0085"
	case '_':
		return "\u00a0"
	case 'L':
		return "\u2028"
	case 'P':
		return "\u2029"
	}
	return ""
}
