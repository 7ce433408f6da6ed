// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/link"
)

// Cleanup removes what the agent leaves in the kernel when it stops: it
// detaches the enforcement program from every device (its pinned links)
// and unpins the maps, i.e. removes <bpfRoot>/ipcache-agent/. Run it only
// when no agent is running. Nothing there is not an error.
//
// Possible errors: a link cannot be detached or a pin removed.
func Cleanup(bpfRoot string) error {
	if err := detachAll(LinksDir(bpfRoot)); err != nil {
		return fmt.Errorf("detach enforcement from every device: %w", err)
	}
	if err := os.RemoveAll(PinDir(bpfRoot)); err != nil {
		return fmt.Errorf("unpin maps in %s: %w", PinDir(bpfRoot), err)
	}
	return nil
}

// detachAll detaches every link pinned in LinksDir, removes the pins (and
// anything else pinned there) and then the directory. A missing directory
// is not an error.
//
// Possible errors: a link cannot be detached or a pin removed (the others are
// still processed), or the directory holds something that is not a pin.
func detachAll(LinksDir string) error {
	entries, err := os.ReadDir(LinksDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach enforcement: %w", err)
	}
	var errs []error
	for _, entry := range entries {
		pin := filepath.Join(LinksDir, entry.Name())
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			// Detach first: unpinning alone leaves the link attached while
			// anything else (a running agent) holds it.
			if err := l.Detach(); err != nil {
				errs = append(errs, fmt.Errorf("detach link %s: %w", pin, err))
			}
			l.Close()
		}
		if err := os.Remove(pin); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(LinksDir); err != nil {
			errs = append(errs, fmt.Errorf("remove links directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
