// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// BPFFSMountFileName is the file in the state directory that records the
// bpffs mount the agent made at --bpf-root (see [BPFFSMount]): `cleanup`
// unmounts a bpffs only when it is recorded there, so that it never
// unmounts one the agent did not mount, and removes it, as it does
// OwnerLockFileName. It is not a declared state file (statedir.Files): it
// belongs to the owner lock, which is no cell.
const BPFFSMountFileName = "bpffs-mount"

// BPFFSMount is what the agent records when it mounts bpffs at --bpf-root
// itself: the path, and whether it made the directory too (which `cleanup`
// then removes once it is unmounted and empty). A later agent that finds
// the mount there leaves the record as it is.
type BPFFSMount struct {
	Path       string `json:"path"`
	CreatedDir bool   `json:"createdDir"`
}

// writeBPFFSMount records m in stateDir.
//
// Possible errors: the file cannot be written.
func writeBPFFSMount(stateDir string, m BPFFSMount) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	path := filepath.Join(stateDir, BPFFSMountFileName)
	if err := os.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("record the bpffs mount in %s: %w", path, err)
	}
	return nil
}

// ReadBPFFSMount returns the bpffs mount the agent recorded in stateDir,
// and false when none is recorded.
//
// Possible errors: the file cannot be read or decoded.
func ReadBPFFSMount(stateDir string) (BPFFSMount, bool, error) {
	path := filepath.Join(stateDir, BPFFSMountFileName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return BPFFSMount{}, false, nil
	}
	if err != nil {
		return BPFFSMount{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	var m BPFFSMount
	if err := json.Unmarshal(data, &m); err != nil || m.Path == "" {
		return BPFFSMount{}, false, fmt.Errorf("read %s: not a bpffs mount record: %q", path, data)
	}
	return m, true, nil
}
