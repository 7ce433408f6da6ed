// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigValidatePolicyDir: a --policy-dir that exists and is not a
// directory is a configuration error naming the flag; a missing one (the
// directory job waits for it) or a directory is not.
func TestConfigValidatePolicyDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, os.Symlink(file, filepath.Join(dir, "to-file")))
	require.NoError(t, os.Symlink(dir, filepath.Join(dir, "to-dir")))

	for _, ok := range []string{"", dir, filepath.Join(dir, "to-dir"), filepath.Join(dir, "missing")} {
		require.NoError(t, Config{PolicyDir: ok, EnablePolicy: EnablePolicyDefault}.Validate(), ok)
	}
	for _, bad := range []string{file, filepath.Join(dir, "to-file")} {
		err := Config{PolicyDir: bad, EnablePolicy: EnablePolicyDefault}.Validate()
		require.ErrorIs(t, err, syscall.ENOTDIR, bad)
		require.ErrorContains(t, err, "--policy-dir "+bad)
	}
}

// TestConfigValidateEnablePolicy: --enable-policy takes default, always
// or never; anything else is a configuration error naming the flag.
func TestConfigValidateEnablePolicy(t *testing.T) {
	for _, ok := range []string{EnablePolicyDefault, EnablePolicyAlways, EnablePolicyNever} {
		require.NoError(t, Config{EnablePolicy: ok}.Validate(), ok)
	}
	for _, bad := range []string{"", "Always", "on", "true"} {
		err := Config{EnablePolicy: bad}.Validate()
		require.ErrorIs(t, err, ErrBadEnablePolicy, bad)
		require.ErrorContains(t, err, "--enable-policy")
	}
}
