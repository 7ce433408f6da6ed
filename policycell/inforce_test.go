// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

func TestInForceRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), InForceFileName)
	contents := map[string][]byte{
		"b.yaml": []byte("name: b\negress: [{toCIDR: [10.0.0.0/8]}]\n"),
		"a.yaml": []byte("# <not> & \"escaped\"\nname: a\n---\nname: c\n"),
		"e.yaml": nil, // in force with no policies
	}
	left, err := savedPolicies(path).Write("/policies", contents)
	require.NoError(t, err)
	require.Empty(t, left)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), `# <not> & \"escaped\"`, "readable: no HTML escapes")

	saved, otherDir, err := readInForce(path, "/policies", false)
	require.NoError(t, err)
	require.Empty(t, otherDir)
	require.Len(t, saved, 3)
	for name, content := range contents {
		require.Equal(t, string(content), string(saved[name].content), name)
	}
	require.Equal(t, []string{"a", "c"}, policyNames(saved["a.yaml"].policies))
	require.Equal(t, "a.yaml", saved["a.yaml"].policies[1].File)
	require.Equal(t, 4, saved["a.yaml"].policies[1].Line)
	require.Empty(t, saved["e.yaml"].policies)

	// Saved for another directory: nothing is restored.
	saved, otherDir, err = readInForce(path, "/elsewhere", false)
	require.NoError(t, err)
	require.Nil(t, saved)
	require.Equal(t, "/policies", otherDir)

	// Not there: nothing to restore.
	saved, _, err = readInForce(filepath.Join(t.TempDir(), InForceFileName), "/policies", false)
	require.NoError(t, err)
	require.Nil(t, saved)
}

func TestInForceCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), InForceFileName)
	for _, tc := range []struct{ content, err string }{
		{``, "EOF"},
		{`{"version":1,"policyDir":"/p","files":[]`, "unexpected EOF"},
		{`{"version":1,"policyDir":"/p","files":[]} {}`, "trailing data"},
		{`{"version":2,"policyDir":"/p","files":[]}`, "version 2, want 1"},
		{`{"version":1,"policyDir":"/p","files":[],"more":1}`, `unknown field "more"`},
		{`{"version":1,"policyDir":"/p","files":[{"file":"../a.yaml","content":""}]}`, `"../a.yaml" is not the name of a policy file`},
		{`{"version":1,"policyDir":"/p","files":[{"file":".a.yaml","content":""}]}`, `".a.yaml" is not the name of a policy file`},
		{`{"version":1,"policyDir":"/p","files":[{"file":"a.txt","content":""}]}`, `"a.txt" is not the name of a policy file`},
		{`{"version":1,"policyDir":"/p","files":[{"file":"a.yaml","content":""},{"file":"a.yaml","content":""}]}`, "a.yaml listed twice"},
		{`{"version":1,"policyDir":"/p","files":[{"file":"a.yaml","content":"name: [x]"}]}`, "a.yaml:1:7: invalid policy file"},
		{`{"version":1,"policyDir":"/p","files":[{"file":"a.yaml","content":"name: x"},{"file":"b.yaml","content":"name: x"}]}`,
			`b.yaml:1: policy name already in use: policy "x" is in force from a.yaml`},
		{`{"version":1,"policyDir":"/p","files":[{"file":"a.yaml","content":"` + strings.Repeat("#", maxFileSize+1) + `"}]}`,
			"a.yaml: policy file too large"},
		{strings.Repeat(" ", maxInForceSize+1), "larger than 33554432 bytes"},
	} {
		require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o600))
		_, _, err := readInForce(path, "/p", false)
		require.ErrorIs(t, err, ErrCorruptInForce, tc.err)
		require.ErrorContains(t, err, path, tc.err)
		require.ErrorContains(t, err, tc.err)
	}
}

// TestInForceCapped: what does not fit into the cap is left out, in name
// order, and the saved file stays within the cap.
func TestInForceCapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), InForceFileName)
	big := append([]byte("#"), bytes.Repeat([]byte("x"), maxFileSize-1024)...)
	contents := map[string][]byte{}
	for _, name := range []string{"a.yaml", "b.yaml", "c.yaml", "d.yaml", "e.yaml", "f.yaml", "g.yaml", "h.yaml", "i.yaml"} {
		contents[name] = big
	}
	contents["small.yaml"] = []byte("name: small\n")
	left, err := savedPolicies(path).Write("/p", contents)
	require.NoError(t, err)
	require.Equal(t, []string{"i.yaml"}, left, "8 files of 4 MiB fit into 32 MiB with room for small.yaml")
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.LessOrEqual(t, info.Size(), int64(maxInForceSize))
	require.Greater(t, info.Size(), int64(8*len(big)))
}

// TestLoaderRestartKeepsLastGood: a restart (a new loader and ipcache over
// the same state directory) starts from what was in force: a file that is
// invalid now keeps its saved version, and a contested name stays with
// the file that held it rather than the first by name. The log says which.
func TestLoaderRestartKeepsLastGood(t *testing.T) {
	dir, stateDir := t.TempDir(), t.TempDir()
	first := newLoaderFixture(t, dir)
	first.loader.saveInForceIn(stateDir)
	first.write(t, "z.yaml", "name: x\negress: [{toCIDR: [10.9.0.0/16]}]\n")
	first.load(t)
	first.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.1.0.0/16]}]\n")
	first.write(t, "b.yaml", "name: x\negress: [{toCIDR: [10.8.0.0/16]}]\n")
	first.load(t)
	require.Equal(t, map[string]string{"a": "a.yaml", "x": "z.yaml"}, first.inForce())
	require.ErrorIs(t, first.rejected()["b.yaml"], ErrNameInUse)

	first.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.1.0.300/16]}]\n")
	var logged bytes.Buffer
	second := newLoaderFixture(t, dir)
	second.loader.log = slog.New(slog.NewTextHandler(&logged, nil))
	second.loader.saveInForceIn(stateDir)
	second.load(t)
	require.Equal(t, map[string]string{"a": "a.yaml", "x": "z.yaml"}, second.inForce())
	require.Equal(t, []string{"10.1.0.0/16"}, second.owned("policy/a"))
	require.Equal(t, []string{"10.9.0.0/16"}, second.owned("policy/x"))
	require.ErrorIs(t, second.rejected()["a.yaml"], policyfile.ErrInvalidPolicy)
	require.EqualError(t, second.rejected()["b.yaml"], `b.yaml:1: policy name already in use: policy "x" is in force from z.yaml`)
	require.Contains(t, logged.String(), `msg="Restored the policies in force before the restart" path=`+filepath.Join(stateDir, InForceFileName)+` files=2 policies=2`)
	require.Contains(t, logged.String(), `msg="Policy file rejected, its version in force before the restart stays in force" file=a.yaml in-force=[a]`)
	require.Contains(t, logged.String(), `msg="Policy file rejected, none of its policies are in force" file=b.yaml in-force=[]`)
	require.NotContains(t, logged.String(), "level=ERROR")

	// Without a save (no state directory), the files alone decide.
	third := newLoaderFixture(t, dir)
	third.load(t)
	require.Equal(t, map[string]string{"x": "b.yaml"}, third.inForce())
}

// TestLoaderCorruptSaveMovedAside: a save that cannot be restored is moved
// aside with an error logged; the files alone decide, and the next save
// replaces it.
func TestLoaderCorruptSaveMovedAside(t *testing.T) {
	dir, stateDir := t.TempDir(), t.TempDir()
	path := filepath.Join(stateDir, InForceFileName)
	require.NoError(t, os.WriteFile(path, []byte(`{"version":1,`), 0o600))
	f := newLoaderFixture(t, dir)
	var logged bytes.Buffer
	f.loader.log = slog.New(slog.NewTextHandler(&logged, nil))
	f.loader.saveInForceIn(stateDir)
	f.write(t, "a.yaml", "name: a\n")
	f.load(t)
	require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce())
	require.Contains(t, logged.String(), `level=ERROR msg="Saved policies in force are corrupt; moved aside, starting from the policy files alone" path=`+path)
	aside, err := os.ReadFile(path + ".corrupt")
	require.NoError(t, err)
	require.Equal(t, `{"version":1,`, string(aside))
	saved, _, err := readInForce(path, dir, false)
	require.NoError(t, err)
	require.Contains(t, saved, "a.yaml")
}

// TestLoaderSaveFails: a state directory that cannot be written makes
// health Degraded, and the save is retried at the next load.
func TestLoaderSaveFails(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(t.TempDir(), "missing")
	f := newLoaderFixture(t, dir)
	f.loader.saveInForceIn(stateDir)
	f.write(t, "a.yaml", "name: a\n")
	f.load(t)
	require.True(t, f.loader.saved.failed)
	require.ErrorContains(t, f.loader.saved.err, "save the policies in force for a restart, retrying: write "+filepath.Join(stateDir, InForceFileName))

	require.NoError(t, os.Mkdir(stateDir, 0o700))
	f.load(t)
	require.False(t, f.loader.saved.failed)
	require.NoError(t, f.loader.saved.err)
	require.FileExists(t, filepath.Join(stateDir, InForceFileName))
}
