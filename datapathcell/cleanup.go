// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"
	"os"
)

// Cleanup removes what the agent leaves in the kernel when it stops: it
// detaches the enforcement program from every device (its pinned links)
// and unpins the maps, i.e. removes <bpfRoot>/ipcache-agent/. Run it only
// when no agent is running. Nothing there is not an error.
//
// Possible errors: a link cannot be detached or a pin removed.
func Cleanup(bpfRoot string) error {
	if err := detachAll(linksDir(bpfRoot)); err != nil {
		return fmt.Errorf("detach enforcement from every device: %w", err)
	}
	if err := os.RemoveAll(PinDir(bpfRoot)); err != nil {
		return fmt.Errorf("unpin maps in %s: %w", PinDir(bpfRoot), err)
	}
	return nil
}
