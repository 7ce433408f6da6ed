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

// readOpened reads an opened policy file (yamldir.Dir.ReadOpened).
func readOpened(f *os.File) (content []byte, isDir bool, err error) {
	return policyDir("").ReadOpened(f)
}
