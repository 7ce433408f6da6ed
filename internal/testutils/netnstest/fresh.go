// SPDX-License-Identifier: Apache-2.0

package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// freshNetnsEnv names the namespace InFreshProcessNetns made, for the
// child that runs in it.
const freshNetnsEnv = "IPCACHE_AGENT_TEST_FRESH_NETNS"

// InFreshProcessNetns is InProcessNetns in a network namespace the parent
// creates for the test (and deletes after it): the child sees only a
// loopback device, up if loopbackUp, and none of the host's addresses and
// devices, whatever other tests of the machine do to them meanwhile. The
// agent's cells follow their namespace's addresses (the host entity), so
// a test that compares whole tables or maps runs in one.
func InFreshProcessNetns(t *testing.T, prefix string, loopbackUp bool) bool {
	t.Helper()
	if ns := os.Getenv(freshNetnsEnv); ns != "" {
		if !InProcessNetns(t, ns) {
			t.Fatalf("%s: not in network namespace %s", t.Name(), ns)
		}
		if loopbackUp {
			if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
				t.Fatalf("ip link set lo up: %v: %s", err, out)
			}
		}
		return true
	}
	ns := fmt.Sprintf("%s-%d", prefix, os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return InProcessNetns(t, ns, freshNetnsEnv+"="+ns)
}
