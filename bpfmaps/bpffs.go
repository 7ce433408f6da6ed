// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// bpffsMagic is BPF_FS_MAGIC, the f_type of a bpffs mount.
const bpffsMagic = 0xcafe4a11

// isBPFFS reports whether path is on a bpffs mount, and whether that mount
// is read-only.
func isBPFFS(path string) (bpffs, readOnly bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, false, err
	}
	return uint32(st.Type) == bpffsMagic, st.Flags&unix.ST_RDONLY != 0, nil
}

// EnsureBPFFS makes sure root is a writable bpffs mount, mounting one there
// (mode 0700) if it is not, creating the directory if needed. It reports
// whether it mounted one. Every error names root and says what to do. The
// owner lock (package cells) calls it before the datapath starts, to lock
// the pin directory on the mount rather than beneath it.
//
// Possible errors: root cannot be created (a path component is a file, or
// the file system is read-only); root cannot be mounted on (typically: not
// root, or no CAP_SYS_ADMIN); root is a read-only bpffs mount, where
// nothing can be pinned.
func EnsureBPFFS(root string) (mounted bool, err error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return false, fmt.Errorf("--bpf-root %s: cannot create the directory to mount bpffs on: %w", root, err)
	}
	bpffs, readOnly, err := isBPFFS(root)
	if err != nil {
		return false, fmt.Errorf("--bpf-root %s: cannot tell whether it is a bpffs mount: %w", root, err)
	}
	if bpffs && readOnly {
		return false, fmt.Errorf("--bpf-root %s: bpffs is mounted read-only, so the agent cannot pin its maps and links there: "+
			"remount it read-write (mount -o remount,rw %s) or choose another --bpf-root: %w", root, root, unix.EROFS)
	}
	if bpffs {
		return false, nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			return false, fmt.Errorf("--bpf-root %s is not a bpffs mount and mounting one needs root (CAP_SYS_ADMIN): %w", root, err)
		}
		return false, fmt.Errorf("--bpf-root %s is not a bpffs mount, and mounting bpffs there failed: %w", root, err)
	}
	return true, nil
}
