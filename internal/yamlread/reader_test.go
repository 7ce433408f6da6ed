// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// readAll reads every document of content, as a text dump per document.
func readAll(content []byte) ([]string, error) {
	r := NewReader(content, 1<<30)
	var docs []string
	for {
		root, err := r.Next()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, err
		}
		var b strings.Builder
		dump(&b, root, "")
		docs = append(docs, b.String())
	}
}

func dump(b *strings.Builder, n Node, indent string) {
	switch n.Kind() {
	case Scalar:
		fmt.Fprintf(b, "%s%d:%d %v %q\n", indent, n.Line(), n.Column(), n.Tag(), n.Value())
	case Mapping:
		fmt.Fprintf(b, "%s%d:%d !!map\n", indent, n.Line(), n.Column())
		for k, v := range n.Pairs() {
			dump(b, k, indent+"  ")
			dump(b, v, indent+"  ")
		}
	case Sequence:
		fmt.Fprintf(b, "%s%d:%d !!seq\n", indent, n.Line(), n.Column())
		for _, item := range n.Items() {
			dump(b, item, indent+"  ")
		}
	}
}

// readAllV3 is readAll by yaml.v3.
func readAllV3(content []byte) (docs []string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("yaml.v3 panicked: %v", p)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(content))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return docs, nil
			}
			return docs, err
		}
		var b strings.Builder
		if len(doc.Content) > 0 {
			dumpV3(&b, doc.Content[0], "")
		}
		docs = append(docs, b.String())
	}
}

func dumpV3(b *strings.Builder, n *yaml.Node, indent string) {
	switch n.Kind {
	case yaml.ScalarNode:
		fmt.Fprintf(b, "%s%d:%d %s %q\n", indent, n.Line, n.Column, n.ShortTag(), n.Value)
	case yaml.MappingNode, yaml.SequenceNode:
		fmt.Fprintf(b, "%s%d:%d %s\n", indent, n.Line, n.Column, n.ShortTag())
		for _, c := range n.Content {
			dumpV3(b, c, indent+"  ")
		}
	default:
		fmt.Fprintf(b, "%s%d:%d kind %d\n", indent, n.Line, n.Column, n.Kind)
	}
}

// differential fails unless this reader agrees with yaml.v3 on content:
// where yaml.v3 rejects it, so does this reader; where both accept it,
// their trees are the same. It returns this reader's error.
func differential(t testing.TB, content []byte) error {
	t.Helper()
	want, wantErr := readAllV3(content)
	got, err := readAll(content)
	switch {
	case wantErr != nil && err == nil:
		t.Errorf("%q: yaml.v3 rejects it (%v), this reader accepts it:\n%s", content, wantErr, strings.Join(got, "---\n"))
	case wantErr == nil && err == nil:
		if w, g := strings.Join(want, "---\n"), strings.Join(got, "---\n"); w != g {
			t.Errorf("%q: yaml.v3 reads\n%s\nthis reader reads\n%s", content, w, g)
		}
	}
	return err
}

func TestDifferentialExamples(t *testing.T) {
	for _, content := range []string{
		"a: b\n",
		"name: a\negress:\n  - toCIDR: [10.0.0.0/8, \"2001:db8::/32\"]\n    toPorts: [{port: 53, protocol: UDP}]\n",
		"- - a\n  - b\n- c: d\n  e: f\n-\n- ~\n",
		"a:\n- b\n- c\nd: e\n",
		"a: |\n  x\n   y\n\n  z\nb: >-\n  folded\n  text\n\n  more\n",
		"a: 'it''s'\nb: \"\\x41\\u00e9\\t\\\"\"\nc: \"line\n  two\"\n",
		"a: plain\n  continued\n  # not a comment? \nb: x#y\nc: a:b\n",
		"---\n---\na\n...\n---\n",
		"%YAML 1.1\n---\n{a: 1, b: [x, y,], c, d: }\n",
		"[a: 1, b: , 0x1f, 0o17, 1.5, .inf, true, null, ~, 2001-12-14, -1, +1, 1_000]\n",
		"\ufeffa: b\r\nc: d\r\n",
		"a: !!str 1\nb: !!int \"2\"\nc: !!float 1\n",
		"",
		"# only\n",
		"a:\n",
		"---",
		"key: [1,\n  2,\n  3]\n",
		"a: |+\n  x\n\n\nb: 1\n",
		"a: |2-\n    x\n",
		"- |\n  a\n- >\n  b\n  c\n",
	} {
		err := differential(t, []byte(content))
		require.NoError(t, err, "%q", content)
	}
}

// TestDifferentialRandom: YAML made of random tokens, most of it invalid.
func TestDifferentialRandom(t *testing.T) {
	tokens := []string{"a", "bb", "1", "-1", "0x1f", "~", "null", "true", "1.5", `"x"`, `"a b"`, `'y'`, `'it''s'`, `"\t\x41"`,
		`"`, `'`, "- ", "-", "? ", ": ", ":", "a:1", `"k":`, "{a: b, c}", ",", "[", "]", "{", "}", "#", " # c", "---", "...",
		"!!str ", "!!int ", "| ", "> ", "|-", ">+", "|2", " ", "  ", "\t", "\n", "\n  ", "\n    ", "\n- ", "\n  - ", "\r\n",
		"key: ", "\nkey: ", "\n  key: ", "x y", "10.0.0.0/8", "2001:db8::/32", "\\", "&x ", "*x", "é", "日本: ", "\"ü\""}
	rng := rand.New(rand.NewPCG(3, 4))
	var b strings.Builder
	failures := 0
	for range 60000 {
		b.Reset()
		for range 1 + rng.IntN(20) {
			b.WriteString(tokens[rng.IntN(len(tokens))])
		}
		differential(t, []byte(b.String()))
		if t.Failed() {
			if failures++; failures > 10 {
				return
			}
		}
	}
}

// examplePolicies returns the policy files of the repository's tests and
// examples: the *.yaml and *.yml files, and the files of those names in
// the txtar archives of the scripts.
func examplePolicies(tb testing.TB) map[string][]byte {
	files := map[string][]byte{}
	root := filepath.Join("..", "..") // the repository
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			content, err := os.ReadFile(path)
			files[path] = content
			return err
		case ".txtar":
			content, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var name string
			var file []byte
			for _, line := range strings.SplitAfter(string(content), "\n") {
				if header, ok := strings.CutPrefix(line, "-- "); ok && strings.HasSuffix(line, " --\n") {
					if name != "" {
						files[path+":"+name] = file
					}
					name, file = "", nil
					if n := strings.TrimSuffix(header, " --\n"); strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml") {
						name = n
					}
					continue
				}
				if name != "" {
					file = append(file, line...)
				}
			}
			if name != "" {
				files[path+":"+name] = file
			}
		}
		return nil
	})
	require.NoError(tb, err)
	require.NotEmpty(tb, files)
	return files
}

// TestDifferentialExamplePolicies: every policy file of the repository
// reads the same as with yaml.v3 (the invalid ones of the tests are
// rejected by both or by this reader only).
func TestDifferentialExamplePolicies(t *testing.T) {
	accepted := 0
	for name, content := range examplePolicies(t) {
		if err := differential(t, content); err == nil {
			accepted++
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	t.Logf("%d policy files read alike", accepted)
	require.Positive(t, accepted)
}

// FuzzReader: this reader never panics, rejects what yaml.v3 rejects, and
// reads the same tree (kinds, values, resolved tags, positions) where
// both accept the input.
func FuzzReader(f *testing.F) {
	for _, seed := range []string{
		"name: a\negress:\n  - toCIDR: [10.0.0.0/8, \"2001:db8::/32\"]\n    toPorts: [{port: 53, protocol: UDP}]\n",
		"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: web\n  namespace: default\n  labels: {app: web}\nspec:\n  podSelector:\n    matchLabels:\n      app: web\n  policyTypes:\n  - Ingress\n  - Egress\n  ingress:\n  - from:\n    - ipBlock:\n        cidr: 172.17.0.0/16\n        except:\n        - 172.17.1.0/24\n    ports:\n    - protocol: TCP\n      port: 6379\n  egress:\n  - to:\n    - ipBlock: {cidr: 10.0.0.0/24}\n    ports: [{protocol: UDP, port: 53, endPort: 60}]\n",
		"apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: \"to-cidr\"\nspec:\n  description: >-\n    Allow egress to\n    the database.\n  endpointSelector:\n    matchLabels:\n      'k8s:app': api\n  egress:\n    - toCIDRSet:\n        - cidr: 10.0.0.0/8\n          except: [\"10.96.0.0/12\"]\n      toPorts:\n        - ports:\n            - port: \"5432\"\n              protocol: TCP\n---\napiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: deny}\nspec:\n  endpointSelector: {}\n  egressDeny:\n  - toCIDR:\n    - 192.0.2.0/24\n...\n",
		"a: |\n  x\n   y\n\n  z\nb: >-\n  folded\n  text\n\n  more\nc: |+2\n   keep\n\n",
		"a: 'it''s'\nb: \"\\x41\\u00e9\\t\\\"\\\n  joined\"\nc: \"line\n\n  two\"\n",
		"%YAML 1.1\n---\n{a: 1, b: [x, y,], c, d: , \"e\":f}\n",
		"[a: 1, b: , 0x1f, 0o17, 1.5, .inf, true, null, ~, 2001-12-14, -1, +1, 1_000, !!str 3, !!float 2]\n",
		"\ufeffa: b\r\nc:\r\n- d\r\n",
		"- - a\n  - b\n- c: d\n  e: f\n-\n- ~\n",
		"&a x: *a\n", "? a\n: b\n", "a: !foo b\n", "a: b\na: c\n", "a:\n\t- b\n", "a: \"b\n", "a: [b, c\n",
	} {
		f.Add([]byte(seed))
	}
	for _, content := range examplePolicies(f) {
		f.Add(content)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := differential(t, data); err != nil {
			var yerr *Error
			if !errors.As(err, &yerr) || yerr.Line < 1 || yerr.Column < 1 {
				t.Fatalf("%q: error without a position: %v", data, err)
			}
		}
	})
}

// BenchmarkRead reads policy files of 1 MiB with yaml.v3 (into
// yaml.Node, as the parser did) and with this reader; B/op against
// bytes/file is the multiple of the file's size that reading allocates.
func BenchmarkRead(b *testing.B) {
	const size = 1 << 20
	fill := func(head, unit, tail string) []byte {
		var buf bytes.Buffer
		buf.WriteString(head)
		for buf.Len()+len(unit)+len(tail) <= size {
			buf.WriteString(unit)
		}
		buf.WriteString(tail)
		return buf.Bytes()
	}
	files := []struct {
		name    string
		content []byte
	}{
		{"flow-CIDRs", fill("name: a\negress:\n  - toCIDR: [", "10.1.2.3/32, ", "10.0.0.0/32]\n")},
		{"block-CIDRs", fill("name: a\negress:\n  - toCIDR:\n", "      - 10.1.2.3/32\n", "")},
		{"documents", fill("", "---\nname: p\negress: [{toCIDR: [10.0.0.0/8], toPorts: [{port: 53, protocol: UDP}]}]\n", "")},
	}
	for _, file := range files {
		b.Run(file.name+"/yaml.v3", func(b *testing.B) {
			b.ReportAllocs()
			b.ReportMetric(float64(len(file.content)), "bytes/file")
			for b.Loop() {
				dec := yaml.NewDecoder(bytes.NewReader(file.content))
				for {
					var doc yaml.Node
					if dec.Decode(&doc) != nil {
						break
					}
				}
			}
		})
		b.Run(file.name+"/yamlread", func(b *testing.B) {
			b.ReportAllocs()
			b.ReportMetric(float64(len(file.content)), "bytes/file")
			for b.Loop() {
				r := NewReader(file.content, 1<<30)
				for {
					if _, err := r.Next(); err != nil {
						require.ErrorIs(b, err, io.EOF)
						break
					}
				}
			}
		})
	}
}

// TestRejects: what this reader does not take, with the position and the
// reason.
func TestRejects(t *testing.T) {
	for _, tc := range []struct {
		content, want string
		sentinel      error
	}{
		{"a: &x b\nc: *x\n", "1:4: anchors (&) and aliases are not supported", ErrUnsupported},
		{"a: *x\n", "1:4: aliases (*) are not supported", ErrUnsupported},
		{"a: !foo b\n", `1:4: tag "!foo" is not supported`, ErrUnsupported},
		{"a: !!binary b\n", `1:4: tag "!!binary" is not supported`, ErrUnsupported},
		{"a: !!int b\n", `1:4: "b" is not a !!int`, ErrUnsupported},
		{"? a\n: b\n", `1:1: complex mapping keys ("? ") are not supported`, ErrUnsupported},
		{"[a]: b\n", "1:1: a collection as a mapping key is not supported", ErrUnsupported},
		{"{a: 1, a: 2}\n", `1:8: mapping key "a" given twice (first at line 1)`, ErrSyntax},
		{"a: 1\nb: 2\na: 3\n", `3:1: mapping key "a" given twice (first at line 1)`, ErrSyntax},
		{"a:\n\tb: 1\n", "2:1: tab character where indentation is read", ErrSyntax},
		{"a:\n  b: 1\n c: 2\n", "3:2: bad indentation", ErrSyntax},
		{"a: 'b\n", "1:4: unterminated quoted scalar", ErrSyntax},
		{"a: [b, c\n", "2:1: unterminated flow collection", ErrSyntax},
		{"a: b: c\n", "a block mapping cannot start on this line", ErrSyntax},
		{"<<: {a: b}\n", "1:1: merge keys (<<) are not supported", ErrUnsupported},
		{"%TAG ! tag:x,2000:\n---\na\n", "1:1: %TAG directives are not supported", ErrUnsupported},
		{"a: \"\\q\"\n", `1:5: unknown escape \q`, ErrSyntax},
		{"a: b\u0085c\n", "1:5: line break U+0085 is not supported", ErrSyntax},
		{strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), "collections nested more than 100 deep", ErrTooDeep},
		{strings.Repeat("- ", MaxDepth+1) + "a\n", "collections nested more than 100 deep", ErrTooDeep},
	} {
		_, err := readAll([]byte(tc.content))
		require.ErrorIs(t, err, tc.sentinel, "%q", tc.content)
		require.ErrorContains(t, err, tc.want, "%q", tc.content)
	}
	r := NewReader([]byte("[1, 2, 3, 4]\n---\n[1, 2]\n"), 4)
	_, err := r.Next()
	require.ErrorIs(t, err, ErrTooManyNodes)
	require.EqualError(t, err, "1:11: more than 4 nodes in a document")
	_, again := r.Next()
	require.Equal(t, err, again, "the error sticks")
}

// TestValuesAreSubstrings: a value written as it is read is a part of the
// content, not a copy; one that differs from its text is a copy.
func TestValuesAreSubstrings(t *testing.T) {
	r := NewReader([]byte("name: a\negress:\n  - toCIDR: [10.0.0.0/8, \"192.0.2.0/24\", '2001:db8::/32', \"\\x41\"]\n"), 100)
	root, err := r.Next()
	require.NoError(t, err)
	inContent := func(v string) bool {
		start := uintptr(unsafe.Pointer(unsafe.StringData(r.s)))
		p := uintptr(unsafe.Pointer(unsafe.StringData(v)))
		return p >= start && p < start+uintptr(len(r.s))
	}
	var values []string
	var walk func(n Node)
	walk = func(n Node) {
		if n.Kind() == Scalar {
			values = append(values, n.Value())
			if n.Value() == "A" {
				require.False(t, inContent(n.Value()), "an escaped value is a copy")
			} else {
				require.True(t, inContent(n.Value()), "%q is a substring of the content", n.Value())
			}
		}
		for k, v := range n.Pairs() {
			walk(k)
			walk(v)
		}
		for _, item := range n.Items() {
			walk(item)
		}
	}
	walk(root)
	require.Equal(t, []string{"name", "a", "egress", "toCIDR", "10.0.0.0/8", "192.0.2.0/24", "2001:db8::/32", "A"}, values)
}

// genBlock writes a random block node (mostly valid YAML) whose lines
// are indented by indent, for TestDifferentialStructured.
func genBlock(rng *rand.Rand, b *strings.Builder, indent, depth int) {
	scalars := []string{"a", "x y", "10.0.0.0/8", "2001:db8::1", "443", "0x1F", "1e3", "~", "null", "", "true", "TCP",
		`"q: #"`, `'it''s'`, `"\u00e9\n"`, "a:b", "a#b", "-x", "2001-12-14", ".5", "+1", "!!str 12", "!!int \"7\""}
	pad := strings.Repeat(" ", indent)
	scalar := func() string { return scalars[rng.IntN(len(scalars))] }
	switch k := rng.IntN(10); {
	case depth > 3 || k < 2:
		b.WriteString(" " + scalar() + "\n")
	case k == 2:
		b.WriteString(" [" + scalar() + ", {k: " + scalar() + "}, [" + scalar() + "],]\n")
	case k == 3:
		b.WriteString(" " + []string{"|", ">", "|-", ">+", "|2"}[rng.IntN(5)] + "\n")
		for range 1 + rng.IntN(3) {
			b.WriteString(pad + "  " + []string{"text", " more", "", "x: y"}[rng.IntN(4)] + "\n")
		}
	case k < 7:
		b.WriteString("\n")
		for i := range 1 + rng.IntN(3) {
			b.WriteString(pad + fmt.Sprintf("k%d:", i))
			genBlock(rng, b, indent+1+rng.IntN(2), depth+1)
		}
	default:
		b.WriteString("\n")
		for range 1 + rng.IntN(3) {
			b.WriteString(pad + "-")
			genBlock(rng, b, indent+2, depth+1)
		}
	}
}

// TestDifferentialStructured: random nested block and flow collections,
// nearly all valid, read the same as with yaml.v3.
func TestDifferentialStructured(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var b strings.Builder
	accepted := 0
	for range 3000 {
		b.Reset()
		b.WriteString("root:")
		genBlock(rng, &b, 2, 0)
		if differential(t, []byte(b.String())) == nil {
			accepted++
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d of 3000 accepted by both", accepted)
	require.Greater(t, accepted, 1000)
}

// TestGetDescribe: Get finds a mapping's value by its key, and nothing in
// other kinds; Describe names each kind.
func TestGetDescribe(t *testing.T) {
	r := NewReader([]byte("a: 1\nb: [x]\nc: {d: e}\n\"f\": ~\n"), 100)
	root, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"a": `"1"`, "b": "a list", "c": "a mapping", "f": "nothing"} {
		value, ok := root.Get(key)
		if !ok || Describe(value) != want {
			t.Errorf("Get(%q) = %s, %v, want %s", key, Describe(value), ok, want)
		}
	}
	if _, ok := root.Get("d"); ok {
		t.Error("Get found a key of a nested mapping")
	}
	b, _ := root.Get("b")
	if _, ok := b.Get("x"); ok {
		t.Error("Get found a key in a sequence")
	}
}
