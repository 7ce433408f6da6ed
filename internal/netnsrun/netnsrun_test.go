// SPDX-License-Identifier: Apache-2.0

package netnsrun_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/netnsrun"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// TestPrivilegedDo checks that fn sees the namespace's devices, not the
// caller's, that the thread comes back, and that fn's error is returned.
func TestPrivilegedDo(t *testing.T) {
	privileged.Test(t)
	ns := fmt.Sprintf("netnsrun-%d", os.Getpid())
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	out, err = exec.Command("ip", "-n", ns, "link", "add", "nr0", "type", "veth", "peer", "name", "nr1").CombinedOutput()
	require.NoError(t, err, string(out))

	inside := func() error {
		_, err := net.InterfaceByName("nr0")
		return err
	}
	require.Error(t, inside(), "the caller's namespace has no nr0")
	require.NoError(t, netnsrun.Do(ns, inside), "the namespace's device")
	require.Error(t, inside(), "back in the caller's namespace")

	sentinel := errors.New("fn failed")
	require.ErrorIs(t, netnsrun.Do(ns, func() error { return sentinel }), sentinel)
	require.Error(t, netnsrun.Do(ns+"-none", inside), "no such namespace")
}
