// SPDX-License-Identifier: Apache-2.0

// Package cnitest runs a real CNI chain for tests: the reference plugins
// ptp and host-local (Debian's containernetworking-plugins, in
// /usr/lib/cni) followed by ipcache-agent-cni, driven by the real cnitool
// at the version of github.com/containernetworking/cni in go.mod, in
// network namespaces the test creates: a "host" one, where ptp puts the
// host end of its veth (so that what ptp changes, forwarding included,
// stays out of the machine's own namespace), and a "pod" one.
package cnitest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// PluginDir is where Debian's containernetworking-plugins installs the
// reference plugins.
const PluginDir = "/usr/lib/cni"

// Network is the name of the chain's network configuration list.
const Network = "ipcache-test"

// Chain is a CNI chain ptp + ipcache-agent-cni and its namespaces.
type Chain struct {
	t       testing.TB
	HostNS  string // namespace of the host end of the veth (`ip netns` name)
	PodNS   string // namespace of the workload
	Subnet  string // host-local's subnet: the pod gets .2, the host end .1
	cnitool string
	env     []string
	gcConf  string // NETCONFPATH of the GC configuration list
}

// Config is what the chain's ipcache-agent-cni entry says.
type Config struct {
	SocketPath string
	Labels     map[string]string
	// HostNS is an existing namespace (`ip netns` name) to put the host
	// end of the veth in, e.g. the one a test runs the agent in; empty
	// creates one.
	HostNS string
}

// New builds cnitool and the plugin, writes the network configuration and
// creates the namespaces, which the test's cleanup deletes. Call it in a
// privileged test: without the reference plugins it skips the test with a
// message, or fails it under CI=true, where the set-up (.ci/run) installs
// them.
func New(t testing.TB, subnet string, cfg Config) *Chain {
	t.Helper()
	for _, p := range []string{"ptp", "host-local"} {
		if _, err := os.Stat(filepath.Join(PluginDir, p)); err != nil {
			msg := fmt.Sprintf("CNI reference plugin %s missing (apt-get install containernetworking-plugins): %v", p, err)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	goBuild(t, "", "build", "-o", filepath.Join(bin, "ipcache-agent-cni"),
		"github.com/ipcache-agent/ipcache-agent/cmd/ipcache-agent-cni")
	version := strings.TrimSpace(goBuild(t, "", "list", "-m", "-f", "{{.Version}}", "github.com/containernetworking/cni"))
	goBuild(t, bin, "install", "github.com/containernetworking/cni/cnitool@"+version)

	netDir := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(netDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var labels []map[string]string
	for k, v := range cfg.Labels {
		labels = append(labels, map[string]string{"key": k, "value": v})
	}
	conflist := map[string]any{
		"cniVersion": "1.0.0",
		"name":       Network,
		"plugins": []any{
			map[string]any{
				"type": "ptp",
				// A default route, so the pod reaches the host's other
				// addresses through the host end of the veth.
				"ipam": map[string]any{"type": "host-local", "subnet": subnet, "dataDir": filepath.Join(dir, "ipam"),
					"routes": []any{map[string]any{"dst": "0.0.0.0/0"}}},
			},
			map[string]any{
				"type":       "ipcache-agent-cni",
				"socketPath": cfg.SocketPath,
				"args":       map[string]any{"cni": map[string]any{"labels": labels}},
			},
		},
	}
	body, err := json.Marshal(conflist)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(netDir, Network+".conflist"), body, 0o600); err != nil {
		t.Fatal(err)
	}
	// GC needs version 1.1.0, which the reference plugins do not support:
	// the GC list has ipcache-agent-cni alone, under the same name.
	gcDir := filepath.Join(dir, "net-gc.d")
	conflist["cniVersion"] = "1.1.0"
	conflist["plugins"] = conflist["plugins"].([]any)[1:]
	body, err = json.Marshal(conflist)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(gcDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gcDir, Network+".conflist"), body, 0o600); err != nil {
		t.Fatal(err)
	}

	suffix := fmt.Sprintf("%d-%s", os.Getpid()%100000, regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	c := &Chain{
		t: t, HostNS: cfg.HostNS, PodNS: "cni-pod-" + suffix, Subnet: subnet,
		cnitool: filepath.Join(bin, "cnitool"),
		gcConf:  gcDir,
		env: append(os.Environ(),
			"NETCONFPATH="+netDir,
			"CNI_PATH="+bin+":"+PluginDir,
			"CNI_IFNAME=eth0"),
	}
	created := []string{c.PodNS}
	if c.HostNS == "" {
		c.HostNS = "cni-host-" + suffix
		created = append(created, c.HostNS)
	}
	t.Cleanup(func() {
		// A test that failed between ADD and DEL leaves libcni's cached
		// result in /var/lib/cni and ptp's veth: DEL removes them.
		c.Run("del", "")
		for _, ns := range created {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range created {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
	}
	return c
}

// Run runs `cnitool <command> <network> <pod namespace>` in the host
// namespace with cniArgs as CNI_ARGS, and returns its output.
//
// Possible errors: cnitool's exit, with its output.
func (c *Chain) Run(command, cniArgs string) (string, error) {
	c.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", c.HostNS, c.cnitool, command, Network, "/run/netns/"+c.PodNS)
	cmd.Env = append(c.env, "CNI_ARGS="+cniArgs)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cnitool %s: %w: %s", command, err, out)
	}
	return string(out), nil
}

// goBuild runs the go command (GOBIN=gobin if set) and returns its
// output; it fails the test if the command fails.
func goBuild(t testing.TB, gobin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = os.Environ()
	if gobin != "" {
		cmd.Env = append(cmd.Env, "GOBIN="+gobin)
	}
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = string(exit.Stderr)
		}
		t.Fatalf("go %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// GC runs `cnitool gc` for the chain's network with ipcache-agent-cni
// alone, at version 1.1.0 (the first with GC). cnitool names no valid
// attachments: libcni DELs those it cached for the network, then the
// plugin's GC finds every attachment the agent still holds stale.
//
// Possible errors: cnitool's exit, with its output.
func (c *Chain) GC() (string, error) {
	c.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", c.HostNS, c.cnitool, "gc", Network, "/run/netns/"+c.PodNS)
	cmd.Env = append(c.env, "NETCONFPATH="+c.gcConf)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cnitool gc: %w: %s", err, out)
	}
	return string(out), nil
}
