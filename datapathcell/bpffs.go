package datapathcell

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// bpffsMagic is BPF_FS_MAGIC, the f_type of a bpffs mount.
const bpffsMagic = 0xcafe4a11

// isBPFFS reports whether path is on a bpffs mount.
func isBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return uint32(st.Type) == bpffsMagic, nil
}

// ensureBPFFS makes sure root is a bpffs mount, mounting one there if it is
// not (creating the directory if needed).
//
// Possible errors: root cannot be created or mounted on (typically: not
// root, or no CAP_SYS_ADMIN).
func ensureBPFFS(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("bpf root %s: %w", root, err)
	}
	mounted, err := isBPFFS(root)
	if err != nil {
		return fmt.Errorf("bpf root %s: %w", root, err)
	}
	if mounted {
		return nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("bpf root %s is not a bpffs mount and mounting one needs root (CAP_SYS_ADMIN): %w", root, err)
		}
		return fmt.Errorf("mount bpffs at %s: %w", root, err)
	}
	return nil
}
