// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/shell"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// OwnerLockFileName is the lock file in the state directory. It holds the
// pid of the agent that owns the directory, or last did.
const OwnerLockFileName = "owner.lock"

// ownerCell makes the agent the one owner of its --state-dir and of its pins
// under --bpf-root before anything else starts: its start hook is the first
// of the control plane's, so a second agent stops before it touches maps,
// links, checkpoint or socket. It mounts bpffs at --bpf-root if needed and
// records that it did (BPFFSMountFileName).
var ownerCell = cell.Invoke(registerOwner)

type ownerParams struct {
	cell.In

	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	StateDir  statedir.Config
	Datapath  datapathcell.Config
	// The shell's, when the hive serves it (an embedding agent may not).
	Shell shell.Config `optional:"true"`
}

func registerOwner(p ownerParams) {
	var owner *Owner
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			// The pin directory is locked on the bpffs mount, so it is mounted
			// first; a state directory or shell socket that is not ours must
			// stop us before even that.
			var err error
			owner, err = AcquireOwner(p.StateDir.StateDir, "")
			if err != nil {
				return err
			}
			if p.Shell.ShellSockPath != "" {
				if err := owner.lockShellSocket(p.Shell.ShellSockPath); err != nil {
					owner.Release()
					return err
				}
			}
			root := p.Datapath.BPFRoot
			_, statErr := os.Stat(root)
			mounted, err := bpfmaps.EnsureBPFFS(root)
			if err == nil && mounted {
				p.Log.Info("Mounted bpffs", "bpf-root", root)
				// For `cleanup`, which unmounts only what the agent mounted. A
				// record that cannot be written costs only that: the mount is
				// left to the operator.
				if p.StateDir.StateDir != "" {
					record := BPFFSMount{Path: root, CreatedDir: errors.Is(statErr, os.ErrNotExist)}
					if err := writeBPFFSMount(p.StateDir.StateDir, record); err != nil {
						p.Log.Warn("cleanup will not unmount the bpffs the agent mounted", "error", err)
					}
				}
			}
			if err == nil {
				err = owner.lockPins(p.Datapath.BPFRoot)
			}
			if err != nil {
				owner.Release()
				return err
			}
			return nil
		},
		OnStop: func(cell.HookContext) error {
			// Last of the stop hooks, as the lock is first of the start hooks.
			p.Log.Info("The pins and the enforcement stay after the agent stops; `ipcache-agent cleanup` removes them",
				"pins", bpfmaps.PinDir(p.Datapath.BPFRoot))
			return owner.Release()
		},
	})
}

// Owner holds the owner locks of a state directory and of the pins under a
// bpffs root: flock(2) locks, which the kernel drops when the process
// ends, however it ends, so an agent that was killed does not block the
// next one.
type Owner struct {
	stateLock *os.File // <state-dir>/owner.lock
	pinDir    *os.File // <bpf-root>/ipcache-agent, the directory itself
	shellLock *os.File // <shell-sock-path>.lock
}

// AcquireOwner makes the caller the owner of stateDir and of the pins under
// bpfRoot (which must be a bpffs mount: see bpfmaps.EnsureBPFFS),
// creating the state directory, its lock file and the pin directory if
// needed. An empty path is not locked. The lock file gets the caller's
// pid. Release gives both up.
//
// Possible errors: ErrOwned, naming the owner's pid, when a running agent
// owns either; the state directory cannot be created or written, or the
// pin directory cannot be created or opened.
func AcquireOwner(stateDir, bpfRoot string) (*Owner, error) {
	o := &Owner{}
	if stateDir != "" {
		if err := o.lockStateDir(stateDir); err != nil {
			return nil, err
		}
	}
	if bpfRoot != "" {
		if err := o.lockPins(bpfRoot); err != nil {
			o.Release()
			return nil, err
		}
	}
	return o, nil
}

func (o *Owner) lockStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory %s (--state-dir): %w", dir, err)
	}
	path := filepath.Join(dir, OwnerLockFileName)
	// The lock is held on a read-only descriptor: one open for writing
	// would keep the file system from being remounted read-only.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("state directory %s (--state-dir) is not writable, so the agent cannot lock it: "+
			"make it writable or choose another --state-dir: %w", dir, err)
	}
	if err := lock(f, "--state-dir "+dir); err != nil {
		f.Close()
		return err
	}
	// For a human: the kernel knows the owner anyway (/proc/locks).
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		f.Close()
		return fmt.Errorf("state directory %s (--state-dir) is not writable: %w", dir, err)
	}
	o.stateLock = f
	return nil
}

func (o *Owner) lockPins(bpfRoot string) error {
	dir := bpfmaps.PinDir(bpfRoot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--bpf-root %s: create the pin directory %s: %w", bpfRoot, dir, err)
	}
	// bpffs holds no regular files: the directory itself is locked.
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("--bpf-root %s: open the pin directory: %w", bpfRoot, err)
	}
	if err := lock(f, "--bpf-root "+bpfRoot+" (pins in "+dir+")"); err != nil {
		f.Close()
		return err
	}
	o.pinDir = f
	return nil
}

// ShellLockSuffix names the lock file of a shell socket: the socket's path
// and this suffix.
const ShellLockSuffix = ".lock"

// lockShellSocket makes the agent the owner of the shell socket's path:
// two agents of different state directories and bpffs roots with the same
// --shell-sock-path would otherwise replace each other's socket (the shell
// removes a stale one before it listens). The lock is a file next to the
// socket. A socket that answers though nobody holds the lock is an agent's
// that does not take it (an older version): it is not ours either.
func (o *Owner) lockShellSocket(path string) error {
	what := "--shell-sock-path " + path
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the directory of %s: %w", what, err)
	}
	f, err := os.OpenFile(path+ShellLockSuffix, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("create the lock file of %s: %w", what, err)
	}
	if err := lock(f, what); err != nil {
		f.Close()
		return err
	}
	if pid, live := socketListener(path); live {
		f.Close()
		if pid > 0 {
			return fmt.Errorf("%s is %w (pid %d, listening on it): stop it first", what, ErrOwned, pid)
		}
		return fmt.Errorf("%s is %w (listening on it): stop it first", what, ErrOwned)
	}
	o.shellLock = f
	return nil
}

// socketListener reports whether a process listens on the UNIX socket at
// path and, when the kernel tells (SO_PEERCRED), its pid.
func socketListener(path string) (pid int, live bool) {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return 0, false
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, true
	}
	raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid, true
}

// Release gives up the locks. The lock file keeps the pid: that of the
// last owner, once none runs. A nil Owner holds none.
//
// Possible errors: closing a descriptor fails.
func (o *Owner) Release() error {
	if o == nil {
		return nil
	}
	var errs []error
	for _, f := range []*os.File{o.stateLock, o.pinDir, o.shellLock} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	o.stateLock, o.pinDir, o.shellLock = nil, nil, nil
	return errors.Join(errs...)
}

// lock takes f's exclusive flock without waiting; what names the locked
// thing in the error.
func lock(f *os.File, what string) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("lock %s of %s: %w", f.Name(), what, err)
	}
	if pid, ok := lockHolder(f); ok {
		return fmt.Errorf("%s is %w (pid %d): stop it first", what, ErrOwned, pid)
	}
	return fmt.Errorf("%s is %w: stop it first", what, ErrOwned)
}

// lockHolder returns the pid of the process holding the flock on f's
// file, from /proc/locks, where a lock reads
// "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF". The
// kernel lists the locks a page at a time, each read starting again at
// the line number the last one ended at: when other processes take or
// drop locks in between, a line can be missed. It reads the list again
// (a few times) before it gives up on naming the holder.
func lockHolder(f *os.File) (int, bool) {
	for range lockHolderReads {
		if pid, ok := lockHolderOnce(f); ok {
			return pid, true
		}
	}
	return 0, false
}

// lockHolderReads bounds the reads of /proc/locks that lockHolder makes.
const lockHolderReads = 5

// lockHolderOnce is one read of /proc/locks for lockHolder.
func lockHolderOnce(f *os.File) (int, bool) {
	info, err := f.Stat()
	if err != nil {
		return 0, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	file := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(locks), "\n") {
		fields := strings.Fields(line)
		// Waiters ("1: -> FLOCK ...") shift the fields and hold nothing.
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != file {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			return pid, true
		}
	}
	return 0, false
}
