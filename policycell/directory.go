// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"os"

	"github.com/ipcache-agent/ipcache-agent/internal/yamldir"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// maxFileSize caps a policy file: a larger one is rejected without being
// read further (policyfile.MaxSize says why).
const maxFileSize = policyfile.MaxSize

// policyDir is the policy directory dir as yamldir reads it.
func policyDir(dir string) yamldir.Dir {
	return yamldir.Dir{Path: dir, MaxSize: maxFileSize, What: "policy"}
}

// listing is what one read of the policy directory found.
type listing struct {
	// files are the policy files by name: their content, or why it could
	// not be read.
	files map[string]fileContent

	// watchDirs are the directories whose changes can change the policy
	// files: the policy directory and those holding symlink targets.
	watchDirs []string
}

type fileContent struct {
	content []byte
	err     error
}

// readDirectory reads the policy files directly in dir, as
// yamldir.Dir.Read does: symlinks only while they stay inside dir.
//
// Possible errors: those of yamldir.Dir.Read.
func readDirectory(dir string) (listing, error) {
	read, err := policyDir(dir).Read()
	if err != nil {
		return listing{}, err
	}
	found := listing{files: make(map[string]fileContent, len(read.Files)), watchDirs: read.WatchDirs}
	for name, f := range read.Files {
		found.files[name] = fileContent{content: f.Content, err: f.Err}
	}
	return found, nil
}

// readOpened reads an opened policy file (yamldir.Dir.ReadOpened).
func readOpened(f *os.File) (content []byte, isDir bool, err error) {
	return policyDir("").ReadOpened(f)
}
