// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAcquireOwnerIsExclusive: a second owner of the same state directory
// (here: another open file in this process, as flock counts them) gets
// ErrOwned naming the owner's pid; once the first releases, it succeeds.
func TestAcquireOwnerIsExclusive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	first, err := AcquireOwner(dir, "")
	require.NoError(t, err)
	lock, err := os.ReadFile(filepath.Join(dir, OwnerLockFileName))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(lock))

	_, err = AcquireOwner(dir, "")
	require.ErrorIs(t, err, ErrOwned)
	require.ErrorContains(t, err, "--state-dir "+dir)
	require.ErrorContains(t, err, "pid "+strconv.Itoa(os.Getpid()))

	require.NoError(t, first.Release())
	second, err := AcquireOwner(dir, "")
	require.NoError(t, err)
	require.NoError(t, second.Release())
}
