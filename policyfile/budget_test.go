// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// decodeV3 decodes content with yaml.v3 as Parse did before its own
// reader, one document at a time, for the baseline of the memory test.
func decodeV3(content []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(content))
	for {
		var doc yaml.Node
		if dec.Decode(&doc) != nil {
			return
		}
	}
}

// countNodes is the number of nodes of the largest document of content.
func countNodes(t *testing.T, content []byte) int {
	var count func(n node) int
	count = func(n node) int {
		c := 1
		for k, v := range n.Pairs() {
			c += count(k) + count(v)
		}
		for _, item := range n.Items() {
			c += count(item)
		}
		return c
	}
	docs := newDocumentReader(content, 1<<30)
	largest := 0
	for {
		root, err := docs.next()
		if errors.Is(err, io.EOF) {
			return largest
		}
		require.NoError(t, err)
		largest = max(largest, count(root))
	}
}

// TestNodeBudgetPolicies: policy files as they are written take at least
// nodeBytes bytes per node, so the budget rejects none of them whatever
// their size.
func TestNodeBudgetPolicies(t *testing.T) {
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
		content := []byte(strings.Repeat(unit, MaxSize/len(unit)-1))
		if !strings.HasSuffix(unit, "\n") {
			content = []byte("[" + string(content) + "a]")
		}
		count := countNodes(t, content)
		t.Logf("%s: %d nodes in the largest document, %.1f bytes of the file per node", name, count, float64(len(content))/float64(count))
		require.LessOrEqual(t, count, nodeBudget(len(content)), "%s: %d bytes per node", name, len(content)/count)
	}
}

// parseAllocMultiple is the documented bound (policyfile/README.md,
// docs/SCALE.md) of what parsing a policy file allocates, garbage
// included, as a multiple of the file's size, whatever the file: the
// reader's nodes are 32 bytes and a document may have one per nodeBytes
// bytes (8 times the size), plus the content as a string (once) and the
// values that differ from their text (at most their text).
const parseAllocMultiple = 10

// manyPoliciesAllocMultiple bounds a file of many tiny policies, whose
// Policy values cost more than their text (docs/SCALE.md; a rule's label
// peer and entity fields raised it above the 30 written there).
const manyPoliciesAllocMultiple = 34

// peakHeap runs f and returns its total allocation and the peak of the
// heap above what it was before, sampled every 100µs with the collector
// made eager (GOGC 5), so that the heap is close to what is live.
func peakHeap(f func()) (allocated, peak uint64) {
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	done := make(chan struct{})
	sampled := make(chan uint64)
	go func() {
		var highest uint64
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			highest = max(highest, m.HeapAlloc)
			select {
			case <-done:
				sampled <- highest
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	f()
	close(done)
	highest := <-sampled
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if highest > before.HeapAlloc {
		peak = highest - before.HeapAlloc
	}
	return after.TotalAlloc - before.TotalAlloc, peak
}

// TestParseMemoryBounded: what a parse allocates (garbage included, so
// more than its peak) is at most parseAllocMultiple times the file's
// size, for valid files as dense as policies are written and for files
// made to cost the most: documents at the node budget, and documents over
// it (rejected at the first node over). yaml.v3's decoding of the same
// files, the reader before, is measured too, for the record (-v).
func TestParseMemoryBounded(t *testing.T) {
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
		name    string
		content []byte
		err     string
		// most is the bound, parseAllocMultiple unless the policies
		// themselves cost more.
		most int
	}{
		// Over the node budget: rejected at the first node over it.
		{"flow list of tiny values", fill(MaxSize, "name: a\negress: [", "1,", ""), tooMany, 0},
		{"null items", fill(MaxSize, "", "-\n", ""), tooMany, 0},
		{"flow mapping of keys", fill(MaxSize, "{", "a,", "}"), tooMany, 0},
		{"short keys", fill(MaxSize, "", "a: b\n", "a"), tooMany, 0},
		// Under the budget: values that allocate their own string.
		{"escaped values", fill(MaxSize, "[", "\"\\n\",", "]"), "want a mapping, got a list", 0},
		// A quarter of the cap: the multiple does not depend on the size.
		{"flow mapping of keys at the budget", fill(MaxSize/4, "{", "aaaaaa, ", "]"), "expected a value before ']'", 0},
		{"CIDRs, then a syntax error", fill(MaxSize/4, "name: a\negress:\n  - toCIDR:\n", "      - 1.2.3.4/32\n", "\t- x: [\n"),
			"tab character", 0},
		// Valid files, the densest a policy is written.
		{"flow CIDRs", fill(MaxSize/4, "name: a\negress:\n  - toCIDR: [", "10.1.2.3/32, ", "10.0.0.0/32]\n"), "", 0},
		{"block CIDRs", fill(MaxSize/4, "name: a\negress:\n  - toCIDR:\n", "      - 10.1.2.3/32\n", ""), "", 0},
		// Tiny policies: what the Policy values themselves cost
		// dominates (docs/SCALE.md).
		{"many documents", docs(MaxSize / 4), "", manyPoliciesAllocMultiple},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := float64(len(tc.content))
			var allocatedV3, peakV3 uint64
			if len(tc.content) < MaxSize/2 {
				allocatedV3, peakV3 = peakHeap(func() { decodeV3(tc.content) })
			}
			var err error
			allocated, peak := peakHeap(func() { _, err = Parse("big.yaml", tc.content) })
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrInvalidPolicy)
				require.ErrorContains(t, err, tc.err)
			}
			t.Logf("allocated %.1f times the file's size, peak heap %.1f (yaml.v3 decoding: %.1f, %.1f)",
				float64(allocated)/size, float64(peak)/size, float64(allocatedV3)/size, float64(peakV3)/size)
			most := cmp.Or(tc.most, parseAllocMultiple)
			require.Less(t, allocated, uint64(most*len(tc.content)),
				"allocated %.1f times the file's size", float64(allocated)/size)
			require.Less(t, peak, uint64(most*len(tc.content)),
				"peak heap %.1f times the file's size", float64(peak)/size)
		})
	}
}

func TestParseTooManyNodes(t *testing.T) {
	content := []byte("name: a\negress: [{toCIDR: [" + strings.Repeat("1,", 10000) + "]}]\n")
	_, err := Parse("dense.yaml", content)
	var fileErr *FileError
	require.True(t, errors.As(err, &fileErr))
	require.EqualError(t, err, "dense.yaml:2: invalid policy file: more YAML values, lists and mappings in a document than a file of 20031 bytes may have (9103: one per 4 bytes, plus 4096)")
}
