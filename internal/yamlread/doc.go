// SPDX-License-Identifier: Apache-2.0

// Package yamlread reads the YAML of policy and endpoint files into a
// compact tree, one document at a time, with the memory of that tree
// bounded by the file's size.
//
// A node is 32 bytes, kept in chunks that are reused from one document to
// the next; a scalar's value is a substring of the file's content (which
// is converted to a string once), and only scalars whose text differs
// from their value (escapes, folded lines, block scalars) allocate their
// own. A document may have at most the number of nodes the caller allows
// (ErrTooManyNodes) and collections nest at most MaxDepth deep
// (ErrTooDeep), so whatever the file, the reader's memory is at most 32
// bytes per allowed node plus the file's size.
//
// It reads the YAML that policy and Kubernetes manifests use: block and
// flow mappings and sequences (compact and indentless sequences, trailing
// commas), plain, single- and double-quoted scalars (all escapes, line
// folding), literal and folded block scalars (chomping and indentation
// indicators), comments, documents separated by "---" and ended by "...",
// a "%YAML 1.1" directive (yaml.v3 takes no other), a byte order mark, CRLF line
// breaks. Scalars are resolved by the core schema as yaml.v3 does (null,
// bool, int, float, timestamp, str), and positions (line and column,
// 1-based, in characters) are those yaml.v3 gives its nodes.
//
// It rejects, with the position and the reason (ErrUnsupported), what a
// policy file has no use for and what could make a small file a large
// tree: anchors and aliases, tags other than !!str, !!int, !!bool,
// !!null, !!float, !!map and !!seq (and a tag that does not fit its
// node), complex keys ("? ", a collection as a key), empty keys, the merge
// key "<<", %TAG directives, and the line breaks and control characters
// YAML 1.2 does not allow in a file; and, as yaml.v3 does (ErrSyntax),
// duplicate keys, tabs in indentation, bad indentation, unterminated
// quotes and flow collections. Where yaml.v3 is more lenient than YAML
// 1.2 (a multi-line key, "--- key: value"), this reader rejects too.
package yamlread
