// SPDX-License-Identifier: Apache-2.0

package policycell

// The YAML decoder builds the tree of a whole document before it can
// report an error, and a node of the tree costs the same whatever its size
// in the file: a file of many tiny nodes ("[1,1,1,..." or "-\n-\n-\n...")
// would cost a hundred times its size or more before it is rejected. So a
// document may have at most one node per nodeBytes bytes of the file's
// size, plus nodeAllowance for small files. This is checked before
// decoding, on the raw bytes, with a count that is never below the number
// of nodes the decoder would build. A list of short CIDRs, the densest
// part of a policy, takes six bytes or more per counted node; documents
// are decoded one at a time, so a file of many small policies is not
// limited by their total.
const (
	nodeBytes     = 4
	nodeAllowance = 4096
)

// nodeBudget is the most nodes a document of a file of size bytes may have.
func nodeBudget(size int) int { return size/nodeBytes + nodeAllowance }

// countNodes returns a number that is at least the number of nodes
// (yaml.Node, the document included) that decoding the largest document of
// content builds, counting no further once it is over limit; line is the
// line the count got to.
//
// It does not parse: it charges every place where the YAML grammar can
// start a node, whatever the context (inside a quoted scalar or a comment
// as well), so that it can only count too many: each word (a run of bytes
// that are neither blanks nor flow indicators: every scalar, alias, tag
// or anchor starts one), each '[' and '{', each ',' and '}' that ends an
// entry without a value indicator (an entry of a flow mapping without
// value gets a null), each "- " and "? " (a block sequence or mapping,
// and a null item), each value indicator ':' (a
// mapping, a null key when nothing precedes it on its line, a null value
// when nothing follows it), and each document marker (a document and its
// null root).
func countNodes(content []byte, limit int) (count, line int) {
	const (
		none = iota
		word
		indicator
	)
	count, line = 2, 1 // the first document and its root
	largest := 0
	prevBlank := true // the previous byte ends a word
	last := none      // the last thing on this line
	// hasValue: a value indicator since the last line break, ',', '[' or
	// '{', so the flow entry that ',' or '}' ends has a value. If the
	// indicator is not one for the decoder (in a quoted scalar), its
	// charge covers the entry's null.
	hasValue := false
	for i := 0; i < len(content) && count <= limit; i++ {
		c := content[i]
		switch {
		case c == '\n' || c == '\r':
			if c == '\n' || i+1 == len(content) || content[i+1] != '\n' {
				line++
			}
			prevBlank, last, hasValue = true, none, false
			continue
		case c == ' ' || c == '\t':
			prevBlank = true
			continue
		case c == '[' || c == '{':
			count++
			prevBlank, last, hasValue = true, indicator, false
		case c == ']':
			prevBlank, last = true, word // a flow collection can be a key
		case c == '}':
			if !hasValue {
				count++
			}
			prevBlank, last, hasValue = true, word, false
		case c == ',':
			if !hasValue {
				count++
			}
			prevBlank, last, hasValue = true, indicator, false
		case prevBlank && (c == '-' || c == '?') && blankAt(content, i+1):
			count++
			if c == '?' {
				count++
			}
			if restBlank(content, i+1) {
				count++
			}
			last = indicator
		case c == ':' && (prevBlank || blankAt(content, i+1) || flowAt(content, i+1) ||
			i > 0 && (content[i-1] == '"' || content[i-1] == '\'')):
			count++
			if last != word {
				count++
			}
			if restBlank(content, i+1) {
				count++
			}
			prevBlank, last, hasValue = true, indicator, true
		default:
			if prevBlank {
				count++
				if (i == 0 || content[i-1] == '\n' || content[i-1] == '\r') && docMarkerAt(content, i) {
					// A new document (and its root), whose tree is
					// built once the one before is gone.
					largest = max(largest, count)
					count = 3
				}
			}
			prevBlank, last = false, word
		}
	}
	return max(largest, count), line
}

// blankAt reports whether content has a blank, a line break or its end at i.
func blankAt(content []byte, i int) bool {
	return i >= len(content) || content[i] == ' ' || content[i] == '\t' || content[i] == '\n' || content[i] == '\r'
}

func flowAt(content []byte, i int) bool {
	return i < len(content) && (content[i] == ',' || content[i] == '[' || content[i] == ']' || content[i] == '{' || content[i] == '}')
}

// restBlank reports whether only blanks follow i before the end of the
// line, the end of content, or the end of a flow entry (',', ']', '}').
func restBlank(content []byte, i int) bool {
	for ; i < len(content); i++ {
		switch content[i] {
		case ' ', '\t':
		case '\n', '\r', ',', ']', '}':
			return true
		default:
			return false
		}
	}
	return true
}

// docMarkerAt reports whether a document marker ("---" or "...") starts
// at i, followed by a blank or the end.
func docMarkerAt(content []byte, i int) bool {
	if i+3 > len(content) || !blankAt(content, i+3) {
		return false
	}
	marker := string(content[i : i+3])
	return marker == "---" || marker == "..."
}
