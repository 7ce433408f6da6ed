// SPDX-License-Identifier: Apache-2.0

package statedir_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/statedir"
)

func TestSetAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o600))
	require.NoError(t, os.WriteFile(path+".corrupt", []byte("older"), 0o600))

	aside, err := statedir.SetAside(path)
	require.NoError(t, err)
	require.Equal(t, path+".corrupt", aside)
	require.Equal(t, aside, statedir.AsideName(path))
	require.NoFileExists(t, path)
	content, err := os.ReadFile(aside)
	require.NoError(t, err)
	require.Equal(t, "old", string(content), "the older copy is replaced")

	_, err = statedir.SetAside(path)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestFilesGroup: what two cells declare is what Files holds.
func TestFilesGroup(t *testing.T) {
	declare := func(name string) func() statedir.FileOut {
		return func() statedir.FileOut { return statedir.FileOut{File: statedir.File{Name: name}} }
	}
	var files []statedir.File
	h := hive.New(
		cell.Module("first", "First cell", cell.Provide(declare("a.json"))),
		cell.Module("second", "Second cell", cell.Provide(declare("b.json"))),
		cell.Invoke(func(f statedir.Files) { files = f.Files }),
	)
	require.NoError(t, h.Populate(hivetest.Logger(t)))
	require.ElementsMatch(t, []statedir.File{{Name: "a.json"}, {Name: "b.json"}}, files)
}
