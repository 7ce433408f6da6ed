// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func savedEndpoints(t *testing.T) Saved {
	return Saved{Path: filepath.Join(t.TempDir(), "endpoints-in-force.json"), DirKey: "endpointDir",
		Name: "endpoints in force", MaxSize: 1 << 10}
}

// TestSavedRoundTrip: what is written is read back, for its directory
// only, in name order, readable.
func TestSavedRoundTrip(t *testing.T) {
	s := savedEndpoints(t)
	d := Dir{Path: "/endpoints", MaxSize: 100, What: "endpoint"}
	left, err := s.Write(d.Path, map[string][]byte{"b.yaml": []byte("b: <&>\n"), "a.yml": []byte("a\n"), "e.yaml": nil})
	require.NoError(t, err)
	require.Empty(t, left)
	data, err := os.ReadFile(s.Path)
	require.NoError(t, err)
	require.Equal(t, `{"version":1,"endpointDir":"/endpoints","files":[`+"\n"+
		`{"file":"a.yml","content":"a\n"},`+"\n"+`{"file":"b.yaml","content":"b: <&>\n"},`+"\n"+
		`{"file":"e.yaml","content":""}`+"\n]}\n", string(data))

	files, otherDir, err := s.Read(d)
	require.NoError(t, err)
	require.Empty(t, otherDir)
	require.Equal(t, []SavedFile{{"a.yml", "a\n"}, {"b.yaml", "b: <&>\n"}, {"e.yaml", ""}}, files)

	files, otherDir, err = s.Read(Dir{Path: "/elsewhere", MaxSize: 100, What: "endpoint"})
	require.NoError(t, err)
	require.Nil(t, files)
	require.Equal(t, "/endpoints", otherDir)

	files, otherDir, err = savedEndpoints(t).Read(d)
	require.NoError(t, err)
	require.Nil(t, files, "no saved file: nothing")
	require.Empty(t, otherDir)
}

// TestSavedCorrupt: a saved file that cannot be restored is an error that
// says so, names the file, and wraps ErrCorruptSaved.
func TestSavedCorrupt(t *testing.T) {
	s := savedEndpoints(t)
	d := Dir{Path: "/e", MaxSize: 10, What: "endpoint"}
	for _, tc := range []struct{ content, err string }{
		{``, "EOF"},
		{`{"version":1,"endpointDir":"/e","files":[]`, "unexpected EOF"},
		{`{"version":1,"endpointDir":"/e","files":[]} {}`, "trailing data"},
		{`{"version":2,"endpointDir":"/e","files":[]}`, "version 2, want 1"},
		{`{"version":1,"policyDir":"/e","files":[]}`, `unknown field "policyDir"`},
		{`{"version":1,"endpointDir":"/e","files":[{"file":"a.yaml","content":"","x":1}]}`, `unknown field "x"`},
		{`{"version":1,"endpointDir":"/e","files":[{"file":"../a.yaml","content":""}]}`, `"../a.yaml" is not the name of an endpoint file`},
		{`{"version":1,"endpointDir":"/e","files":[{"file":".a.yaml","content":""}]}`, `".a.yaml" is not the name of an endpoint file`},
		{`{"version":1,"endpointDir":"/e","files":[{"file":"a.yaml","content":""},{"file":"a.yaml","content":""}]}`, "a.yaml listed twice"},
		{`{"version":1,"endpointDir":"/e","files":[{"file":"a.yaml","content":"01234567890"}]}`, "a.yaml: endpoint file too large"},
		{strings.Repeat(" ", 1<<10+1), "larger than 1024 bytes"},
	} {
		require.NoError(t, os.WriteFile(s.Path, []byte(tc.content), 0o600))
		_, _, err := s.Read(d)
		require.ErrorIs(t, err, ErrCorruptSaved, tc.err)
		require.ErrorContains(t, err, "corrupt saved endpoints in force "+s.Path, tc.err)
		require.ErrorContains(t, err, tc.err)
	}
}

// TestSavedCapped: what does not fit into MaxSize is left out, in name
// order, and the saved file stays within it.
func TestSavedCapped(t *testing.T) {
	s := savedEndpoints(t)
	big := []byte(strings.Repeat("x", 300))
	left, err := s.Write("/e", map[string][]byte{"a.yaml": big, "b.yaml": big, "c.yaml": big, "d.yaml": big, "s.yaml": []byte("s")})
	require.NoError(t, err)
	require.Equal(t, []string{"c.yaml", "d.yaml"}, left)
	info, err := os.Stat(s.Path)
	require.NoError(t, err)
	require.LessOrEqual(t, info.Size(), int64(s.MaxSize))
	files, _, err := s.Read(Dir{Path: "/e", MaxSize: 300, What: "endpoint"})
	require.NoError(t, err)
	require.Len(t, files, 3)
}

// TestSaveKey: the key changes with a name or a content, not with the
// order the map gives.
func TestSaveKey(t *testing.T) {
	a, b := sha256.Sum256([]byte("a")), sha256.Sum256([]byte("b"))
	key := SaveKey(map[string][sha256.Size]byte{"a.yaml": a, "b.yaml": b})
	require.Equal(t, key, SaveKey(map[string][sha256.Size]byte{"b.yaml": b, "a.yaml": a}))
	require.NotEqual(t, key, SaveKey(map[string][sha256.Size]byte{"a.yaml": b, "b.yaml": a}))
	require.NotEqual(t, key, SaveKey(map[string][sha256.Size]byte{"a.yaml": a}))
}

// TestSavedCachedSameBytes: a write that takes entries from the cache
// writes the bytes a fresh encode writes, through changes of content
// under the same name (the cache must not give the old entry), files
// added and removed, and a file left out for size and then fitting again.
func TestSavedCachedSameBytes(t *testing.T) {
	cached, fresh := savedEndpoints(t), savedEndpoints(t)
	var cache SavedEntries
	digestsOf := func(contents map[string][]byte) map[string][sha256.Size]byte {
		digests := map[string][sha256.Size]byte{}
		for name, content := range contents {
			digests[name] = sha256.Sum256(content)
		}
		return digests
	}
	for i, contents := range []map[string][]byte{
		{"a.yaml": []byte("a: 1\n"), "b.yaml": []byte("b: <&>\n")},
		{"a.yaml": []byte("a: 1\n"), "b.yaml": []byte("b: \"2\"\n")},
		{"a.yaml": []byte("a: 1\n"), "c.yaml": []byte("c\n"), "b.yaml": []byte("b: \"2\"\n")},
		{"c.yaml": []byte("c\n"), "d.yaml": []byte(strings.Repeat("d", 2000))},
		{"c.yaml": []byte("c\n"), "d.yaml": []byte("d\n")},
		{"c.yaml": []byte("c: changed\n"), "d.yaml": []byte("d\n")},
	} {
		leftCached, err := cached.WriteCached("/e", contents, digestsOf(contents), &cache)
		require.NoError(t, err)
		leftFresh, err := fresh.Write("/e", contents)
		require.NoError(t, err)
		require.Equal(t, leftFresh, leftCached, "write %d", i)
		got, err := os.ReadFile(cached.Path)
		require.NoError(t, err)
		want, err := os.ReadFile(fresh.Path)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "write %d", i)
		require.Len(t, cache.entries, len(contents)-len(leftCached), "write %d: the entries written, no more", i)
	}
}

// BenchmarkSavedWrite measures a save after one file of a directory
// changed: 10 files of 100,000 CIDRs in all, as bench-peer writes them,
// with every entry encoded (Write) or those of unchanged files taken from
// the cache (WriteCached).
func BenchmarkSavedWrite(b *testing.B) {
	contents := map[string][]byte{}
	for f := range 10 {
		var content strings.Builder
		content.WriteString("name: p\negress:\n  - toCIDR:\n")
		for i := range 10_000 {
			fmt.Fprintf(&content, "      - \"10.%d.%d.%d/32\"\n", f, i>>8, i&0xff)
		}
		contents[fmt.Sprintf("p%d.yaml", f)] = []byte(content.String())
	}
	digests := map[string][sha256.Size]byte{}
	for name, content := range contents {
		digests[name] = sha256.Sum256(content)
	}
	s := Saved{Path: filepath.Join(b.TempDir(), "in-force.json"), DirKey: "policyDir", Name: "policies in force", MaxSize: 32 << 20}
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("cached=%v", cached), func(b *testing.B) {
			var cache SavedEntries
			for i := range b.N {
				changed := fmt.Appendf(nil, "name: change\negress:\n  - toCIDR: [\"192.0.2.%d/32\"]\n", i%256)
				contents["change.yaml"], digests["change.yaml"] = changed, sha256.Sum256(changed)
				var err error
				if cached {
					_, err = s.WriteCached("/p", contents, digests, &cache)
				} else {
					_, err = s.Write("/p", contents)
				}
				require.NoError(b, err)
			}
		})
	}
}
