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
