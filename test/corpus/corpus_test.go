// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testCommit = "0123456789abcdef0123456789abcdef01234567"
	testSum    = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" // of nothing
)

func TestParseManifest(t *testing.T) {
	row := "cilium/cilium\t" + testCommit + "\texamples/a.yaml\t" + testSum + "\t2\tCiliumNetworkPolicy"
	sources, err := ParseManifest(strings.NewReader("# comment\n\n" + manifestHeader + "\n" + row + "\n"))
	require.NoError(t, err)
	require.Equal(t, []Source{{Repository: "cilium/cilium", Commit: testCommit, Path: "examples/a.yaml",
		SHA256: testSum, Documents: 2, Kinds: "CiliumNetworkPolicy"}}, sources)
	require.Equal(t, "cilium+cilium", sources[0].Mirror())
	require.Equal(t, "https://raw.githubusercontent.com/cilium/cilium/"+testCommit+"/examples/a.yaml", sources[0].URL())

	for name, tc := range map[string]struct{ input, want string }{
		"no header":      {row + "\n", "line 1: want the header"},
		"empty":          {"# only a comment\n", "no header"},
		"fields":         {manifestHeader + "\ncilium/cilium\t" + testCommit + "\n", "line 2: 2 fields, want 6"},
		"repository":     {manifestHeader + "\ncilium\t" + testCommit + "\ta.yaml\t" + testSum + "\t1\tk\n", `repository "cilium"`},
		"short commit":   {manifestHeader + "\na/b\tabc\ta.yaml\t" + testSum + "\t1\tk\n", `commit "abc"`},
		"path escapes":   {manifestHeader + "\na/b\t" + testCommit + "\t../a.yaml\t" + testSum + "\t1\tk\n", `path "../a.yaml"`},
		"absolute path":  {manifestHeader + "\na/b\t" + testCommit + "\t/a.yaml\t" + testSum + "\t1\tk\n", `path "/a.yaml"`},
		"sha256":         {manifestHeader + "\na/b\t" + testCommit + "\ta.yaml\tabc\t1\tk\n", `sha256 "abc"`},
		"documents":      {manifestHeader + "\na/b\t" + testCommit + "\ta.yaml\t" + testSum + "\t0\tk\n", `documents "0"`},
		"listed twice":   {manifestHeader + "\n" + row + "\n" + row + "\n", "line 3: cilium/cilium:examples/a.yaml is listed on line 2 already"},
		"header changed": {"repository\tcommit\tpath\n", "want the header"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseManifest(strings.NewReader(tc.input))
			require.ErrorIs(t, err, ErrManifest)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestFileNames(t *testing.T) {
	names := fileNames([]Source{{Path: "a/policy.yaml"}, {Path: "b/policy.yaml"}, {Path: "c.yml"}})
	require.Equal(t, []string{"001-policy.yaml", "002-policy.yaml", "003-c.yml"}, names)
}

func sum(content string) string {
	s := sha256.Sum256([]byte(content))
	return hex.EncodeToString(s[:])
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// TestMaterialize reads a file from a git mirror at its commit (not from
// the newest commit, which changed it), another from a stored copy, and
// fails on a content that is not the manifest's and on a file no mirror
// holds, naming each.
func TestMaterialize(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is needed to read the mirrors: %v", err)
	}
	mirrors := t.TempDir()
	repo := filepath.Join(mirrors, "owner+repo", "repo")
	require.NoError(t, os.MkdirAll(filepath.Join(repo, "policies"), 0o755))
	git(t, repo, "init", "-q")
	const first = "kind: NetworkPolicy\n"
	require.NoError(t, os.WriteFile(filepath.Join(repo, "policies", "p.yaml"), []byte(first), 0o644))
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "first")
	commit := git(t, repo, "rev-parse", "HEAD")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "policies", "p.yaml"), []byte("changed\n"), 0o644))
	git(t, repo, "commit", "-q", "-am", "second")

	const stored = "kind: CiliumNetworkPolicy\n"
	copyPath := filepath.Join(mirrors, "other+copies", testCommit, "examples", "c.yaml")
	require.NoError(t, os.MkdirAll(filepath.Dir(copyPath), 0o755))
	require.NoError(t, os.WriteFile(copyPath, []byte(stored), 0o644))

	sources := []Source{
		{Repository: "owner/repo", Commit: commit, Path: "policies/p.yaml", SHA256: sum(first), Documents: 1},
		{Repository: "other/copies", Commit: testCommit, Path: "examples/c.yaml", SHA256: sum(stored), Documents: 1},
	}
	out := t.TempDir()
	names, err := materialize(sources, []string{t.TempDir(), mirrors}, out)
	require.NoError(t, err)
	require.Equal(t, []string{"001-p.yaml", "002-c.yaml"}, names)
	for i, want := range []string{first, stored} {
		got, err := os.ReadFile(filepath.Join(out, names[i]))
		require.NoError(t, err)
		require.Equal(t, want, string(got))
	}

	bad := []Source{
		{Repository: "owner/repo", Commit: commit, Path: "policies/p.yaml", SHA256: testSum, Documents: 1},
		{Repository: "owner/missing", Commit: testCommit, Path: "p.yaml", SHA256: testSum, Documents: 1},
	}
	_, err = materialize(bad, []string{mirrors}, t.TempDir())
	require.ErrorIs(t, err, ErrChecksum)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorContains(t, err, "owner/missing@"+testCommit+":p.yaml")
}

// TestClassify names the blocker of the agent's errors as
// `policy validate` prints them.
func TestClassify(t *testing.T) {
	const head = `f.yaml:6:7: invalid policy file: policy "default/p": `
	for _, tc := range []struct{ message, want string }{
		{head + "ingress[0].fromEndpoints: selecting endpoints by label is not supported: only fromCIDR, fromCIDRSet and fromEntities world and all", blockFromEndpoints},
		{head + "egressDeny[1].toEndpoints: selecting endpoints by label is not supported", blockToEndpoints},
		{head + "specs[1].egress[0].toEndpoints: selecting endpoints by label is not supported", blockToEndpoints},
		{head + "spec.ingress[0].from[1].podSelector: selecting pods by label is not supported: only ipBlock peers", blockPodSelector},
		{head + "spec.egress[0].to[0].namespaceSelector: selecting namespaces is not supported: only ipBlock peers", blockNamespaceSel},
		{head + `egress[0].toEntities[1]: entity "cluster" is not supported: only world and all`, blockEntities},
		{head + "egress[0].toPorts[0].rules: L7 rules are not supported: this agent enforces L3 and L4 only", blockL7},
		{head + "egress[0].toPorts[0].originatingTLS: TLS origination is not supported", blockTLS},
		{head + "egress[0].toPorts[0].serverNames: TLS server names are not supported", blockTLS},
		{head + "egress[0].toFQDNs: DNS names are not supported: write the CIDRs", blockFQDN},
		{head + "egress[0].toServices: selecting services is not supported: write their CIDRs", blockServices},
		{head + "ingressDeny[0].fromRequires: selecting endpoints by label is not supported", blockRequires},
		{head + "ingress[0].fromNodes: selecting nodes is not supported", blockNodes},
		{head + "ingress[0].authentication: mutual authentication is not supported", blockAuthentication},
		{head + "spec.nodeSelector: host policies are not supported", blockNodeSelector},
		{head + "egress[0].toCIDRSet[0].cidrGroupRef: CIDR groups are not supported", blockCIDRGroups},
		{head + `ingress[0].toPorts[0].ports[0].port: "http": named ports are not supported (this agent knows no pod's ports), write the number`, blockNamedPorts},
		{head + `spec.ingress[0].ports[0].port: "http": named ports are not supported (this agent knows no pod's ports), write the number`, blockNamedPorts},
		// A podSelector of the policy itself is read; only a peer's blocks.
		{head + "spec.podSelector: unknown field \"matchFields\", want one of matchLabels, matchExpressions", `unknown field "matchFields"`},
		{head + "spec.podSelector.matchExpressions[0].operator: \"Gt\": want In, NotIn, Exists or DoesNotExist", blockOther},
		{`f.yaml:1:1: invalid policy file: document: apiVersion "extensions/v1beta1", kind "NetworkPolicy" is not a policy this agent reads`, blockUnsupportedKind},
		{`f.yaml:1:1: invalid policy file: document: apiVersion is required`, blockUnsupportedKind},
		{`f.yaml:3:1: invalid policy file: CiliumNetworkPolicy: unknown field "description", want one of apiVersion, kind, metadata, spec, specs, status`, `unknown field "description"`},
		{head + "spec.egress: no rules (write `egress: []` for none)", blockEmptyDirection},
		{"f.yaml:2:1: invalid policy file: yaml: mapping values are not allowed in this context", blockOther},
	} {
		require.Equal(t, tc.want, classify(tc.message), tc.message)
	}
}

// TestRounds puts files that share a policy name in different rounds,
// and each file in the first round where its names are free.
func TestRounds(t *testing.T) {
	files := []string{"a", "b", "c", "d", "e"}
	names := [][]string{{"default/deny-all"}, {"default/deny-all", "x"}, {"y"}, {"default/deny-all"}, {"x"}}
	require.Equal(t, [][]string{{"a", "c", "e"}, {"b"}, {"d"}}, rounds(files, names))
	require.Empty(t, rounds(nil, nil))
}
