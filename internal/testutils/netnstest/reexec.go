// SPDX-License-Identifier: Apache-2.0

package netnstest

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// inNetnsEnv names the test that a test binary run by InProcessNetns runs
// in its namespace.
const inNetnsEnv = "IPCACHE_AGENT_TEST_IN_NETNS"

// InProcessNetns reports whether the calling test runs with its whole
// process in the named network namespace. A hive's goroutines run on any
// thread, so a test of cells that follow the namespace's devices (netlink
// subscriptions, TCX attach by ifindex) runs its process there: the test
// binary again under `ip netns exec ns`, with only this test. In that
// child it returns true and the test goes on; in the parent it runs the
// child with env added to its environment, logs its output, fails t if
// the child fails, and returns false: the test then returns.
func InProcessNetns(t *testing.T, ns string, env ...string) bool {
	t.Helper()
	if os.Getenv(inNetnsEnv) == t.Name() {
		return true
	}
	args := []string{"netns", "exec", ns, os.Args[0],
		"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v"}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(append(os.Environ(), inNetnsEnv+"="+t.Name()), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s in netns %s:\n%s", t.Name(), ns, strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("%s in netns %s: %v", t.Name(), ns, err)
	}
	return false
}
