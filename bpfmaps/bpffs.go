// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
// It mounts nothing from a mount namespace other than the host's (see
// hostMountNamespace), as under `ip netns exec`: the mount would be that
// namespace's only, and the pins, and with them the enforcement, would go
// with it when the agent stops, where they must outlive the agent. A root
// that is already bpffs is used from anywhere: its pins are the mount's.
//
// Possible errors: ErrPrivateMountNamespace (wrapped) when root is not
// bpffs and the process is in a mount namespace of its own; root cannot
// be created (a path component is a file, or the file system is
// read-only); root cannot be mounted on (typically: not root, or no
// CAP_SYS_ADMIN); root is a read-only bpffs mount, where nothing can be
// pinned.
func EnsureBPFFS(root string) (mounted bool, err error) {
	bpffs, readOnly, err := isBPFFS(root)
	if errors.Is(err, fs.ErrNotExist) {
		bpffs, err = false, nil
	}
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
	// Before the directory is made: a refused start leaves nothing.
	if own, host, private := privateMountNamespace(); private {
		mount := fmt.Sprintf("Mount bpffs at %s in the host's mount namespace first (mount -t bpf bpf %s)", root, root)
		if under(root, "/sys") {
			// `ip netns exec` mounts a sysfs of its own on /sys, which hides
			// the host's bpffs at /sys/fs/bpf: mounting it there is no help.
			mount = "Mount bpffs on a directory outside /sys in the host's mount namespace first " +
				"(mount -t bpf bpf DIR) and give it as --bpf-root: `ip netns exec` mounts a sysfs of its own on /sys, " +
				"which hides a bpffs mounted under it"
		}
		return false, fmt.Errorf("--bpf-root %s is not a bpffs mount, and %w (%s; the host's, pid %d's, is %s), "+
			"as under `ip netns exec`: a bpffs mounted from here would be this namespace's only, and the pins, and with them "+
			"the enforcement, would go when the agent stops. %s, or run the agent in the host's mount namespace "+
			"(`nsenter --net=/run/netns/NAME` enters the network namespace only)",
			root, ErrPrivateMountNamespace, own, host.pid, host.namespace, mount)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return false, fmt.Errorf("--bpf-root %s: cannot create the directory to mount bpffs on: %w", root, err)
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			return false, fmt.Errorf("--bpf-root %s is not a bpffs mount and mounting one needs root (CAP_SYS_ADMIN): %w", root, err)
		}
		return false, fmt.Errorf("--bpf-root %s is not a bpffs mount, and mounting bpffs there failed: %w", root, err)
	}
	return true, nil
}

// IsBPFFS reports whether path is on a bpffs mount: pins can be there only
// if it is. A path that does not exist is not.
//
// Possible errors: those of statfs(2) but ENOENT.
func IsBPFFS(path string) (bool, error) {
	bpffs, _, err := isBPFFS(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return bpffs, err
}

// under reports whether path is dir or beneath it.
func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// mountNamespace is a process's mount namespace as /proc shows it
// ("mnt:[4026531832]"), the namespace's identity.
type mountNamespace struct {
	pid       int
	namespace string
}

// privateMountNamespace reports whether this process runs in another
// mount namespace than the host's: that of pid 1, or, when pid 1's cannot
// be read, that of this process's outermost ancestor whose can (see
// hostMountNamespace). It returns both namespaces. When this process's own
// cannot be read, or no reference can, it says no: the check is there to
// stop a mistake, and a process that cannot tell is not refused.
func privateMountNamespace() (own string, host mountNamespace, private bool) {
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return "", mountNamespace{}, false
	}
	host, ok := hostMountNamespace()
	if !ok {
		return own, host, false
	}
	return own, host, own != host.namespace
}

// hostMountNamespace returns the mount namespace of pid 1, the host's
// init on a host, or a container's own first process in a container that
// does not share the host's pids (which shares the container's mount
// namespace, so an agent started there is not refused: a container that
// wants its pins to outlive it mounts the host's bpffs into itself, and
// then nothing is mounted here).
//
// When pid 1's cannot be read (it runs with more privilege than this
// process: a sandbox's or a user namespace's init), the namespace of this
// process's outermost ancestor whose namespace can be read stands for the
// host's: under `ip netns exec` that is the shell or the service manager
// that started it, in the namespace the operator meant. The walk up the
// parents stops at the first that cannot be read, or that is outside
// this pid namespace (ppid 0): what lies beyond is not this process's to
// judge. Without such an ancestor it is this process's own, and nothing
// is refused.
func hostMountNamespace() (mountNamespace, bool) {
	if ns, err := os.Readlink("/proc/1/ns/mnt"); err == nil {
		return mountNamespace{pid: 1, namespace: ns}, true
	}
	var outermost mountNamespace
	found := false
	for pid := os.Getppid(); pid > 1; {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil {
			break
		}
		outermost, found = mountNamespace{pid: pid, namespace: ns}, true
		ppid, err := parentPid(pid)
		if err != nil {
			break
		}
		pid = ppid
	}
	return outermost, found
}

// parentPid returns pid's parent's pid, from /proc/<pid>/status's PPid
// line (0 for a process whose parent is outside this pid namespace).
func parentPid(pid int) (int, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if value, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(value))
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no PPid line", pid)
}
