// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf/link"
)

// Removed is what Cleanup removed, each list sorted.
type Removed struct {
	// Maps are the names of the pins in PinDir other than the links
	// (maps, and anything else pinned there).
	Maps []string
	// Links are the names of the pinned links (LinksDir) removed.
	Links []string
	// Devices are those the enforcement program was detached from: the
	// devices the links are named after (<device>-ingress, <device>-egress,
	// a dot in the device's name as '%').
	Devices []string
}

// Cleanup removes what the agent leaves in the kernel when it stops: it
// detaches the enforcement program from every device (its pinned links)
// and unpins the maps, i.e. removes <bpfRoot>/ipcache-agent/. It returns
// what it removed. Run it only when no agent is running. Nothing there is
// not an error.
//
// Possible errors: a link cannot be detached or a pin removed; what was
// removed until then is returned with the error.
func Cleanup(bpfRoot string) (Removed, error) {
	var removed Removed
	entries, err := os.ReadDir(PinDir(bpfRoot))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return removed, fmt.Errorf("list the pins in %s: %w", PinDir(bpfRoot), err)
	}
	links, err := detachAll(LinksDir(bpfRoot))
	removed.Links = links
	for _, name := range links {
		device, ok := strings.CutSuffix(name, "-ingress")
		if !ok {
			device, ok = strings.CutSuffix(name, "-egress")
		}
		// The datapath pins a device's links with its dots as '%' (a dot
		// in a pin's name is taken).
		device = strings.ReplaceAll(device, "%", ".")
		if ok && !slices.Contains(removed.Devices, device) {
			removed.Devices = append(removed.Devices, device)
		}
	}
	slices.Sort(removed.Devices)
	if err != nil {
		return removed, fmt.Errorf("detach enforcement from every device: %w", err)
	}
	if err := os.RemoveAll(PinDir(bpfRoot)); err != nil {
		return removed, fmt.Errorf("unpin maps in %s: %w", PinDir(bpfRoot), err)
	}
	for _, entry := range entries {
		if entry.Name() != filepath.Base(LinksDir(bpfRoot)) {
			removed.Maps = append(removed.Maps, entry.Name())
		}
	}
	return removed, nil
}

// detachAll detaches every link pinned in LinksDir, removes the pins (and
// anything else pinned there) and then the directory, and returns the
// names of the pins it removed, sorted. A missing directory is not an
// error.
//
// Possible errors: a link cannot be detached or a pin removed (the others are
// still processed), or the directory holds something that is not a pin.
func detachAll(LinksDir string) ([]string, error) {
	entries, err := os.ReadDir(LinksDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("detach enforcement: %w", err)
	}
	var errs []error
	var removed []string
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
			continue
		}
		removed = append(removed, entry.Name())
	}
	if len(errs) == 0 {
		if err := os.Remove(LinksDir); err != nil {
			errs = append(errs, fmt.Errorf("remove links directory: %w", err))
		}
	}
	return removed, errors.Join(errs...)
}
