// SPDX-License-Identifier: Apache-2.0

// Package jsoncmd is a script command for tests of commands' -o json:
// the previous command's stdout must be one JSON document, and a field of
// it must hold a value.
package jsoncmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/cilium/hive/script"
)

// Commands returns `json/field`.
func Commands() map[string]script.Cmd {
	return map[string]script.Cmd{"json/field": fieldCmd()}
}

func fieldCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Check that stdout is one JSON document whose field holds a value",
			Args:    "path value",
			Detail: []string{
				"The path is dot-separated object keys and array indices (0.identity);",
				"'.' is the document itself. The value is compared as JSON when it",
				"parses as JSON (16777217, true, \"x\", [], null), else as a string.",
				"'#' as the value checks the length of an array or object is the",
				"number after it (#3).",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			dec := json.NewDecoder(strings.NewReader(s.Stdout()))
			dec.UseNumber()
			var doc any
			if err := dec.Decode(&doc); err != nil {
				return nil, fmt.Errorf("stdout is not JSON: %w", err)
			}
			if dec.More() {
				return nil, fmt.Errorf("stdout holds more than one JSON document")
			}
			got, err := field(doc, args[0])
			if err != nil {
				return nil, err
			}
			if n, ok := strings.CutPrefix(args[1], "#"); ok {
				want, err := strconv.Atoi(n)
				if err != nil {
					return nil, script.ErrUsage
				}
				var length int
				switch g := got.(type) {
				case []any:
					length = len(g)
				case map[string]any:
					length = len(g)
				default:
					return nil, fmt.Errorf("%s is %v, not an array or object", args[0], got)
				}
				if length != want {
					return nil, fmt.Errorf("%s has %d elements, want %d", args[0], length, want)
				}
				return nil, nil
			}
			gotJSON, _ := json.Marshal(got)
			wantJSON := []byte(strconv.Quote(args[1]))
			var want any
			wdec := json.NewDecoder(strings.NewReader(args[1]))
			wdec.UseNumber()
			if wdec.Decode(&want) == nil && !wdec.More() {
				wantJSON, _ = json.Marshal(want)
			}
			if !bytes.Equal(gotJSON, wantJSON) {
				return nil, fmt.Errorf("%s is %s, want %s", args[0], gotJSON, wantJSON)
			}
			return nil, nil
		})
}

func field(doc any, path string) (any, error) {
	if path == "." {
		return doc, nil
	}
	cur := doc
	for _, part := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[part]
			if !ok {
				return nil, fmt.Errorf("%s: no field %q", path, part)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("%s: no element %q in an array of %d", path, part, len(c))
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("%s: %q is in neither an object nor an array", path, part)
		}
	}
	return cur, nil
}
