// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var errEmpty = errors.New("emptied")

// names are a toy format: one name a line, "#" comments; a line "!" is
// invalid.
func newNames() *Versions[[]string] {
	return &Versions[[]string]{
		Parse: func(file string, content []byte) ([]string, error) {
			names := []string{}
			for line := range strings.Lines(string(content)) {
				line = strings.TrimSpace(line)
				if line == "!" {
					return nil, fmt.Errorf("%s: invalid", file)
				}
				if line != "" && !strings.HasPrefix(line, "#") {
					names = append(names, line)
				}
			}
			return names, nil
		},
		Empty:      func(names []string) bool { return len(names) == 0 },
		EmptyError: func(file string) error { return fmt.Errorf("%s: %w", file, errEmpty) },
		ReadError:  func(file string, err error) error { return fmt.Errorf("%s: %w", file, err) },
		Claims:     func(names []string) []string { return names },
		Conflict: func(file string, names []string, holder map[string]string) error {
			for _, n := range names {
				if other, held := holder[n]; held && other != file {
					return fmt.Errorf("%s: %s is held by %s", file, n, other)
				}
			}
			return nil
		},
	}
}

func listing(files map[string]string) Listing {
	l := Listing{Files: map[string]File{}}
	for name, content := range files {
		l.Files[name] = File{Content: []byte(content), Digest: sha256.Sum256([]byte(content))}
	}
	return l
}

// kinds sums up changes as "file:kind".
func kinds(changes []Change[[]string]) []string {
	var out []string
	for _, c := range changes {
		out = append(out, fmt.Sprintf("%s:%d", c.File, c.Kind))
	}
	return out
}

func TestVersions(t *testing.T) {
	v := newNames()
	require.Empty(t, v.Update(listing(map[string]string{"a.yaml": "x\ny\n", "b.yaml": "z\n"})))
	require.Equal(t, []string{"a.yaml:1", "b.yaml:1"}, kinds(v.Decide()))
	require.Equal(t, map[string][]string{"a.yaml": {"x", "y"}, "b.yaml": {"z"}}, v.InForce())

	// Invalid, emptied, unreadable, conflicting: each keeps its version
	// in force, and is reported once.
	found := listing(map[string]string{"a.yaml": "!\n", "b.yaml": "# nothing\n", "c.yaml": "x\n"})
	found.Files["d.yaml"] = File{Err: errors.New("cannot")}
	v.Update(found)
	changes := v.Decide()
	require.ElementsMatch(t, []string{"a.yaml:3", "b.yaml:3", "c.yaml:3", "d.yaml:3"}, kinds(changes))
	require.Empty(t, v.Decide(), "each rejection is reported once")
	require.Equal(t, map[string][]string{"a.yaml": {"x", "y"}, "b.yaml": {"z"}}, v.InForce())
	status := map[string]error{}
	for _, s := range v.Status() {
		status[s.File] = s.Err
	}
	require.EqualError(t, status["a.yaml"], "a.yaml: invalid")
	require.ErrorIs(t, status["b.yaml"], errEmpty)
	require.EqualError(t, status["c.yaml"], "c.yaml: x is held by a.yaml")
	require.EqualError(t, status["d.yaml"], "d.yaml: cannot")
	content, parsed, ok := v.Current("a.yaml")
	require.True(t, ok)
	require.Nil(t, content, "a rejected content is not kept")
	require.Nil(t, parsed)

	// A name moves from one file to another in one change, whatever the
	// order of the files; b.yaml, written back, is valid again.
	v.Update(listing(map[string]string{"a.yaml": "y\n", "b.yaml": "z\n", "c.yaml": "x\n", "d.yaml": ""}))
	require.ElementsMatch(t, []string{"a.yaml:1", "c.yaml:1", "d.yaml:1", "b.yaml:2"}, kinds(v.Decide()))
	require.Equal(t, map[string][]string{"a.yaml": {"y"}, "b.yaml": {"z"}, "c.yaml": {"x"}, "d.yaml": {}}, v.InForce())
	contents, digests := v.InForceContents()
	require.Equal(t, "x\n", string(contents["c.yaml"]))
	require.Len(t, digests, 4)

	// A file removed is forgotten, with its version in force.
	require.Equal(t, []string{"a.yaml", "d.yaml"}, v.Update(listing(map[string]string{"b.yaml": "z\n", "c.yaml": "x\n"})))
	require.Empty(t, v.Decide())
	require.Equal(t, map[string][]string{"b.yaml": {"z"}, "c.yaml": {"x"}}, v.InForce())
}

// TestVersionsRestored: a version restored from the previous run stays in
// force while the file is invalid, and says it is the restored one.
func TestVersionsRestored(t *testing.T) {
	v := newNames()
	v.Restore("a.yaml", []byte("x\n"), []string{"x"})
	v.Update(listing(map[string]string{"a.yaml": "!\n"}))
	changes := v.Decide()
	require.Len(t, changes, 1)
	require.Equal(t, Rejected, changes[0].Kind)
	require.True(t, changes[0].Restored)
	require.Equal(t, []string{"x"}, changes[0].InForce)
	require.Equal(t, map[string][]string{"a.yaml": {"x"}}, v.InForce())

	// The same content as restored: in force, nothing to accept.
	v.Update(listing(map[string]string{"a.yaml": "x\n"}))
	require.Equal(t, []string{"a.yaml:2"}, kinds(v.Decide()))
}
