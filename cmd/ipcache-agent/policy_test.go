// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/policygen"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	return dir
}

const (
	validCNP = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: web, namespace: shop}\n" +
		"spec:\n  egress:\n    - toCIDR: [10.0.0.0/8]\n      toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n"
	validNative = "name: a\negress:\n  - toCIDR: [192.0.2.0/24]\n---\nname: b\ningress: [{}]\n"
	fqdnCNP     = "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: fqdn}\n" +
		"spec:\n  egress:\n    - toFQDNs: [{matchName: example.com}]\n"
)

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{
		"cnp.yaml": validCNP, "native.yaml": validNative, "fqdn.yaml": fqdnCNP,
		"typo.yaml":  "name: c\negress:\n  - toCIDR: [10.0.0.0/8]\n    toPort: []\n",
		"again.yaml": "name: a\ningress: [{}]\n",
	})
	path := func(name string) string { return filepath.Join(dir, name) }

	stdout, stderr, code := runAgentCommand(t, "policy", "validate", path("cnp.yaml"), path("native.yaml"))
	require.Equal(t, 0, code, stderr)
	require.Equal(t, path("cnp.yaml")+": ok (1 policy: shop/web; 1 policy map entry)\n"+
		path("native.yaml")+": ok (2 policies: a, b; 1 policy map entry)\n", stdout)
	require.Empty(t, stderr)

	stdout, stderr, code = runAgentCommand(t, "policy", "validate", path("native.yaml"), path("typo.yaml"), path("fqdn.yaml"))
	require.Equal(t, 1, code)
	require.Equal(t, path("native.yaml")+": ok (2 policies: a, b; 1 policy map entry)\n"+
		path("typo.yaml")+`:4:5: invalid policy file: policy "c": egress[0]: unknown field "toPort", want one of toCIDR, toCIDRSet, toPorts, icmps, toEndpoints, toEntities, toFQDNs`+"\n"+
		path("fqdn.yaml")+": ok (1 policy: fqdn; 0 policy map entries)\n", stdout)
	// toFQDNs is valid (the agent's DNS proxy enforces it), but the rule
	// without a DNS rule for its endpoints is a warning: nothing would be
	// learned.
	require.Regexp(t, `^warning: `+regexp.QuoteMeta(path("fqdn.yaml"))+`:6:7: policy "fqdn": egress\[0\]\.toFQDNs: no policy in this file gives its endpoints a DNS rule .*\n`+
		`ipcache-agent: invalid policy files: 1 of 3\n$`, stderr)

	// A name two files use: the first in name order keeps it.
	stdout, _, code = runAgentCommand(t, "policy", "validate", path("native.yaml"), path("again.yaml"))
	require.Equal(t, 1, code)
	require.Equal(t, path("native.yaml")+`:1:7: invalid policy file: policy "a": policy name already in use by `+path("again.yaml")+
		":1 (files are taken in name order, the first keeps the name)\n"+
		path("again.yaml")+": ok (1 policy: a; 0 policy map entries)\n", stdout)

	// A CIDR with host bits set: valid, read as its prefix, with a
	// warning on stderr.
	hostBits := filepath.Join(dir, "hostbits.yaml")
	require.NoError(t, os.WriteFile(hostBits, []byte("name: h\negress:\n  - toCIDR: [10.0.0.5/8]\n"), 0o644))
	stdout, stderr, code = runAgentCommand(t, "policy", "validate", hostBits)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, hostBits+": ok (1 policy: h; 1 policy map entry)\n", stdout)
	require.Equal(t, "warning: "+hostBits+`:3:14: policy "h": egress[0].toCIDR[0]: "10.0.0.5/8": host bits set, read as 10.0.0.0/8`+"\n", stderr)
	stdout, _, code = runAgentCommand(t, "policy", "validate", "-o", "json", hostBits)
	require.Equal(t, 0, code)
	require.Contains(t, stdout, `"warnings": [
        "`+hostBits+`:3:14: policy \"h\": egress[0].toCIDR[0]: \"10.0.0.5/8\": host bits set, read as 10.0.0.0/8"
      ]`)

	// A file that cannot be read is invalid too; a FIFO does not block.
	require.NoError(t, syscall.Mkfifo(path("fifo.yaml"), 0o600))
	stdout, _, code = runAgentCommand(t, "policy", "validate", path("missing.yaml"), dir, path("fifo.yaml"))
	require.Equal(t, 1, code)
	require.Contains(t, stdout, path("missing.yaml")+": open "+path("missing.yaml")+": no such file or directory\n")
	require.Contains(t, stdout, dir+": not a regular file: a directory\n")
	require.Contains(t, stdout, path("fifo.yaml")+": not a regular file: p---------\n")
}

func TestPolicyValidateJSON(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{"cnp.yaml": validCNP, "typo.yaml": "name: c\nnme: d\n"})
	stdout, _, code := runAgentCommand(t, "policy", "validate", "-o", "json", filepath.Join(dir, "cnp.yaml"), filepath.Join(dir, "typo.yaml"))
	require.Equal(t, 1, code)
	var out struct {
		Valid bool `json:"valid"`
		Files []struct {
			File     string   `json:"file"`
			Valid    bool     `json:"valid"`
			Policies []string `json:"policies"`
			Kinds    []string `json:"kinds"`
			Error    string   `json:"error"`
			Line     int      `json:"line"`
			Column   int      `json:"column"`
		} `json:"files"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
	require.False(t, out.Valid)
	require.Len(t, out.Files, 2)
	require.True(t, out.Files[0].Valid)
	require.Equal(t, []string{"shop/web"}, out.Files[0].Policies)
	require.Equal(t, []string{"CiliumNetworkPolicy"}, out.Files[0].Kinds)
	require.False(t, out.Files[1].Valid)
	require.Equal(t, []string{}, out.Files[1].Policies)
	require.Equal(t, 2, out.Files[1].Line)
	require.Equal(t, 1, out.Files[1].Column)
	require.Contains(t, out.Files[1].Error, `unknown field "nme"`)

	stdout, _, code = runAgentCommand(t, "policy", "validate", "--output=json", filepath.Join(dir, "cnp.yaml"))
	require.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(stdout), &out))
	require.True(t, out.Valid)
}

// TestPolicyValidateEntries: the file of CIDRs times port ranges (1,000 /24s
// times 40 port ranges, 18 KB, 872,000 policy map entries) is invalid
// against the agent's default policy map (16,384 entries), at its rule,
// with the count and the limit; with a policy map that holds it, it is
// valid and the count is in the ok line and the JSON.
func TestPolicyValidateEntries(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{
		"big.yaml":   string(policygen.CIDRsTimesPorts("big", 1000, 40)),
		"small.yaml": string(policygen.CIDRsTimesPorts("small", 30, 1)),
		"other.yaml": string(policygen.CIDRsTimesPorts("other", 30, 1)),
	})
	big, small, other := filepath.Join(dir, "big.yaml"), filepath.Join(dir, "small.yaml"), filepath.Join(dir, "other.yaml")

	stdout, stderr, code := runAgentCommand(t, "policy", "validate", big)
	require.Equal(t, 1, code)
	require.Equal(t, big+`:3:5: invalid policy file: policy "big": egress[0]: the file's policies compute 872000 policy map entries `+
		`(each CIDR's identity times the port blocks of the rules that select it), more than the policy map holds (16384, --policy-map-max-entries) `+
		"from this rule on: write fewer CIDRs or port ranges, or raise --policy-map-max-entries\n", stdout)
	require.Equal(t, "ipcache-agent: invalid policy files: 1 of 1\n", stderr)

	stdout, stderr, code = runAgentCommand(t, "policy", "validate", "--policy-map-max-entries=872000", big)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, big+": ok (1 policy: big; 872000 policy map entries)\n", stdout)

	stdout, _, code = runAgentCommand(t, "policy", "validate", "-o", "json", big, small)
	require.Equal(t, 1, code)
	var out struct {
		Valid               bool   `json:"valid"`
		Entries             int    `json:"entries"`
		PolicyMapMaxEntries uint32 `json:"policyMapMaxEntries"`
		Files               []struct {
			Valid        bool   `json:"valid"`
			Error        string `json:"error"`
			Line         int    `json:"line"`
			Column       int    `json:"column"`
			Entries      int    `json:"entries"`
			EntriesExact bool   `json:"entriesExact"`
		} `json:"files"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
	require.False(t, out.Valid)
	require.Equal(t, uint32(16384), out.PolicyMapMaxEntries)
	require.Equal(t, 3, out.Files[0].Line)
	require.Equal(t, 5, out.Files[0].Column)
	require.Equal(t, 872000, out.Files[0].Entries)
	require.True(t, out.Files[0].EntriesExact)
	require.Contains(t, out.Files[0].Error, "more than the policy map holds (16384, --policy-map-max-entries)")
	require.True(t, out.Files[1].Valid)
	require.Equal(t, 30*20, out.Files[1].Entries, "30 CIDRs, 1001-2000 in 10 blocks, TCP and UDP")
	require.Equal(t, 30*20, out.Entries, "the valid files' entries")

	// Each file fits, the two together do not: valid, with a note.
	stdout, stderr, code = runAgentCommand(t, "policy", "validate", "--policy-map-max-entries=1000", small, other)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, small+": ok (1 policy: small; 600 policy map entries)\n"+other+": ok (1 policy: other; 600 policy map entries)\n", stdout)
	require.Equal(t, "ipcache-agent: note: the valid files compute 1200 policy map entries together, more than the policy map holds "+
		"(1000, --policy-map-max-entries): the agent puts them in force, and the entries that do not fit are not in the policy map "+
		"(their traffic is dropped)\n", stderr)

	_, stderr, code = runAgentCommand(t, "policy", "validate", "--policy-map-max-entries=0", small)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--policy-map-max-entries must be positive")
}

func TestPolicyValidateUsage(t *testing.T) {
	t.Parallel()
	_, stderr, code := runAgentCommand(t, "policy", "validate")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "requires at least 1 arg(s)")

	dir := writeFiles(t, map[string]string{"cnp.yaml": validCNP})
	_, stderr, code = runAgentCommand(t, "policy", "validate", "-o", "yaml", filepath.Join(dir, "cnp.yaml"))
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `-o "yaml": want text or json`)

	_, _, code = runAgentCommand(t, "policy", "bogus")
	require.Equal(t, 2, code)
}
