// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// TestValidateFilesNameConflict: a name that an earlier file (in name
// order) has is reported as every error of a file's content: at the
// name's line and column, as an invalid policy file, naming where the
// other file has it, without "in force" (nothing is, offline).
func TestValidateFilesNameConflict(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
		return path
	}
	b := write("b.yaml", "name: other\ningress: [{}]\n---\nname:   a\ningress: [{}]\n")
	a := write("a.yaml", "name: a\negress: [{}]\n")
	results := ValidateFiles([]string{b, a}, 100)
	require.NoError(t, results[1].Err)
	err := results[0].Err
	require.ErrorIs(t, err, policyfile.ErrInvalidPolicy)
	require.ErrorIs(t, err, ErrNameInUse)
	require.EqualError(t, err, b+`:4:9: invalid policy file: policy "a": policy name already in use by `+a+
		`:1 (files are taken in name order, the first keeps the name)`)
	require.Nil(t, results[0].Policies)
}

// TestValidateFilesFQDN: files with toFQDNs or DNS rules are valid (they
// are checked for an agent with its DNS proxy; an agent without rejects
// them: testdata/fqdn.txtar), and a toFQDNs rule whose endpoints the file
// gives no DNS rule keeps its warning.
func TestValidateFilesFQDN(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
		return path
	}
	fqdn := write("fqdn.yaml", "name: a\negress:\n  - toCIDR: [10.0.0.0/8]\n  - toFQDNs: [{matchName: api.example.com}]\n")
	dns := write("dns.yaml", "name: b\negress:\n  - toPorts: [{port: 53, protocol: UDP, rules: {dns: [{matchPattern: \"*\"}]}}]\n")
	plain := write("plain.yaml", "name: c\negress:\n  - toPorts: [{port: 53, protocol: UDP}]\n")
	results := ValidateFiles([]string{fqdn, dns, plain}, 100)

	require.NoError(t, results[0].Err)
	require.Len(t, results[0].Policies, 1)
	require.Equal(t, EntryCount{Entries: 1, Exact: true}, results[0].Entries, "the CIDR's; a toFQDNs rule's identities are learned")
	require.Len(t, results[0].Warnings, 1)
	require.Equal(t, 4, results[0].Warnings[0].Line)
	require.Contains(t, results[0].Warnings[0].String(), "no policy in this file gives its endpoints a DNS rule")

	require.NoError(t, results[1].Err)
	require.Len(t, results[1].Policies, 1)
	require.Empty(t, results[1].Warnings)

	require.NoError(t, results[2].Err)
}
