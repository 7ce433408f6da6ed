// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"bytes"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The parsers of every format read documents through the names in this
// file only, so that the YAML reader behind them is one choice, made here.
type node = yaml.Node

const (
	documentNode = yaml.DocumentNode
	mappingNode  = yaml.MappingNode
	sequenceNode = yaml.SequenceNode
	scalarNode   = yaml.ScalarNode
	aliasNode    = yaml.AliasNode
)

// isNull reports whether n is a null scalar (`~`, `null` or nothing).
func isNull(n *node) bool {
	return n.Kind == scalarNode && n.ShortTag() == "!!null"
}

// documentReader reads the documents of a file one at a time, so that only
// one document's tree is in memory at once.
type documentReader struct {
	dec *yaml.Decoder
}

func newDocumentReader(content []byte) *documentReader {
	return &documentReader{dec: yaml.NewDecoder(bytes.NewReader(content))}
}

// next returns the root of the next document, nil for an empty one.
//
// Possible errors: io.EOF after the last document; a syntax error, which
// syntaxPosition reads.
func (r *documentReader) next() (*node, error) {
	var doc node
	if err := r.dec.Decode(&doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	return doc.Content[0], nil
}

// syntaxPosition returns the line (0 if unknown) and the message of a
// syntax error of the reader: "yaml: line 3: ..." becomes 3, "...".
func syntaxPosition(err error) (line int, msg string) {
	msg = strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if number, text, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(number); err == nil {
				return n, text
			}
		}
	}
	return 0, msg
}
