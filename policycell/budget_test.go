// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// decodedNodes decodes content as ParseFile does and returns the number of
// nodes of the largest document decoded before the end or the first error.
func decodedNodes(content []byte) int {
	var count func(n *yaml.Node) int
	count = func(n *yaml.Node) int {
		c := 1
		for _, child := range n.Content {
			c += count(child)
		}
		return c
	}
	dec := yaml.NewDecoder(bytes.NewReader(content))
	largest := 0
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			return largest
		}
		largest = max(largest, count(&doc))
	}
}

// TestCountNodesBound: countNodes is never below the number of nodes the
// decoder builds for a document, on YAML made of random tokens (most of it invalid) and
// on the test files of the parser.
func TestCountNodesBound(t *testing.T) {
	tokens := []string{"a", "bb", "1", "-1", `"x"`, `"a b"`, `'y'`, `"`, `'`, "- ", "-", "? ", "?", ": ", ":", "a:1",
		`"k":`, `"a: b"`, "{a: b, c}", ",", "[", "]", "{", "}", "#", " # c", "---", "...", "!t ", "&x ", "*x", "| ", "> ", " ", "  ",
		"\t", "\n", "\n  ", "\n    ", "\r\n", "\r", "%YAML 1.2\n", "\\"}
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for range 30000 {
		b.Reset()
		for range 1 + rng.IntN(30) {
			b.WriteString(tokens[rng.IntN(len(tokens))])
		}
		content := []byte(b.String())
		nodes := decodedNodes(content)
		count, _ := countNodes(content, 1<<30)
		require.GreaterOrEqual(t, count, nodes, "%q", content)
	}
	for _, content := range []string{
		"name: a\negress:\n  - toCIDR: [10.0.0.0/8, \"2001:db8::/32\"]\n    toPorts: [{port: 53, protocol: UDP}]\n",
		"{a, b, c}", "[a: 1, b: 2]", `{"a":1,"b":[2,3]}`, "- - - a\n- \n-\n", "? a\n? b\n: c\n", "---\n---\n...\n---\n",
	} {
		count, _ := countNodes([]byte(content), 1<<30)
		require.GreaterOrEqual(t, count, decodedNodes([]byte(content)), "%q", content)
	}
}

// TestCountNodesPolicies: policy files as they are written take at least
// nodeBytes bytes per counted node, so the budget rejects none of them
// whatever their size.
func TestCountNodesPolicies(t *testing.T) {
	for name, unit := range map[string]string{
		"block CIDRs":         "      - 1.2.3.4/32\n",
		"flow CIDRs":          "1.2.3.4/32, ",
		"quoted flow CIDRs":   `"1.2.3.4/32",`,
		"IPv6 CIDRs":          "      - 2001:db8::1/128\n",
		"rules with a port":   "  - toCIDR: [10.0.0.1/32]\n    toPorts: [{port: 443, protocol: TCP}]\n",
		"block ports":         "      - port: 53\n        protocol: UDP\n",
		"CIDR sets":           "      - cidr: 10.0.0.0/8\n        except: [10.1.0.0/16]\n",
		"policy per document": "---\nname: p\negress: [{toCIDR: [10.0.0.0/8]}]\n",
	} {
		content := []byte(strings.Repeat(unit, maxFileSize/len(unit)))
		count, _ := countNodes(content, 1<<30)
		t.Logf("%s: %.1f bytes per counted node", name, float64(len(content))/float64(count))
		require.LessOrEqual(t, count, nodeBudget(len(content)), "%s: %d bytes per counted node", name, len(content)/count)
	}
}

// parseAllocMultiple is the documented bound (policycell/README.md,
// docs/SCALE.md) of what parsing a policy file allocates, garbage
// included, as a multiple of the file's size, whatever the file: yaml.v3
// builds a tree of nodes of about 200 bytes each before a document can be
// checked, and a file may have one node per nodeBytes bytes. Measured at
// 2026-12-03: 58 to 60 for flow lists of CIDRs and for a flow mapping of
// keys at the node budget (the worst adversarial file), 69 for a file of
// many small documents (74 under the race detector; their peak heap is
// 26: each document's tree is garbage once it is checked), 39 for block
// lists.
const parseAllocMultiple = 80

// TestParseFileMemoryBounded: what a parse allocates (garbage included, so
// more than its peak) is at most parseAllocMultiple times the file's size.
// Files of the cap that the decoder would turn into a tree of a hundred or
// more times their size are rejected before decoding; files at the
// budget, malformed only at their end, are decoded to there. The worst of
// those is a flow mapping of keys without values (two nodes for two
// counted).
func TestParseFileMemoryBounded(t *testing.T) {
	const (
		beforeDecoding = 1
		atTheBudget    = parseAllocMultiple
	)
	docs := func(size int) []byte {
		var b bytes.Buffer
		for i := 0; b.Len() < size-100; i++ {
			fmt.Fprintf(&b, "---\nname: p%d\negress: [{toCIDR: [10.0.0.0/8]}]\n", i)
		}
		return b.Bytes()
	}
	fill := func(size int, head, unit, tail string) []byte {
		var b bytes.Buffer
		b.WriteString(head)
		for b.Len()+len(unit)+len(tail) <= size {
			b.WriteString(unit)
		}
		b.WriteString(tail)
		return b.Bytes()
	}
	const tooMany = "more YAML values, lists and mappings in a document than a file of"
	for _, tc := range []struct {
		name        string
		content     []byte
		err         string
		maxMultiple int
	}{
		{"flow list of tiny values", fill(maxFileSize, "name: a\negress: [", "1,", ""), tooMany, beforeDecoding},
		{"null items", fill(maxFileSize, "", "-\n", ""), tooMany, beforeDecoding},
		{"flow mapping of keys", fill(maxFileSize, "{", "a,", "}"), tooMany, beforeDecoding},
		{"short keys", fill(maxFileSize, "", "a: b\n", "a"), tooMany, beforeDecoding},
		{"nested mappings", fill(maxFileSize, "", "a:\n ", "b"), tooMany, beforeDecoding},
		// A quarter of the cap: the multiple does not depend on the size.
		{"flow mapping of keys at the budget", fill(maxFileSize/4, "{", "aaaaaa, ", "]"), "YAML: did not find expected node content", atTheBudget},
		{"CIDRs, then a syntax error", fill(maxFileSize/4, "name: a\negress:\n  - toCIDR:\n", "      - 1.2.3.4/32\n", "\t- x: [\n"),
			"found a tab character that violates indentation", atTheBudget},
		// Valid files, the densest a policy is written.
		{"flow CIDRs", fill(maxFileSize/4, "name: a\negress:\n  - toCIDR: [", "10.1.2.3/32, ", "10.0.0.0/32]\n"), "", atTheBudget},
		{"block CIDRs", fill(maxFileSize/4, "name: a\negress:\n  - toCIDR:\n", "      - 10.1.2.3/32\n", ""), "", atTheBudget},
		{"many documents", docs(maxFileSize / 4), "", atTheBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := ParseFile("big.yaml", tc.content)
			runtime.ReadMemStats(&after)
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrInvalidPolicy)
				require.ErrorContains(t, err, tc.err)
			}
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("allocated %.1f times the file's size", float64(allocated)/float64(len(tc.content)))
			require.Less(t, allocated, uint64(tc.maxMultiple*len(tc.content)),
				"allocated %.1f times the file's size", float64(allocated)/float64(len(tc.content)))
		})
	}
}

func TestParseFileTooManyNodes(t *testing.T) {
	content := []byte("name: a\negress: [{toCIDR: [" + strings.Repeat("1,", 10000) + "]}]\n")
	_, err := ParseFile("dense.yaml", content)
	var fileErr *FileError
	require.True(t, errors.As(err, &fileErr))
	require.EqualError(t, err, "dense.yaml:2: invalid policy file: more YAML values, lists and mappings in a document than a file of 20031 bytes may have (9103: one per 4 bytes, plus 4096)")
}
