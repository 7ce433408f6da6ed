// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os/exec"
	"strings"
)

// The devices and addresses of the three namespaces. The client reaches the
// server only through the router, which forwards; routerClientDev is where
// both filters act (the agent's --devices, nft's iifname).
const (
	routerClientDev = "bpeer-c"
	routerServerDev = "bpeer-s"
	nsDev           = "eth0"

	clientV4, routerClientV4 = "10.250.0.2", "10.250.0.1"
	clientV6, routerClientV6 = "fd00:250::2", "fd00:250::1"
	routerServerV4           = "10.250.1.1"
	routerServerV6           = "fd00:251::1"
)

// The server's addresses: allowed is in the policy from the start, change
// is the one the change under load adds, outside is never allowed.
var (
	serverV4 = serverAddrs{allowed: "10.250.1.2", change: "10.250.1.3", outside: "10.250.1.4"}
	serverV6 = serverAddrs{allowed: "fd00:251::2", change: "fd00:251::3", outside: "fd00:251::4"}
)

type serverAddrs struct{ allowed, change, outside string }

// topology is the three namespaces of one scenario.
type topology struct {
	client, router, server string
}

// newTopology creates the namespaces, the veths client<->router<->server,
// their addresses and routes, and forwarding in the router. On error what
// was made is removed.
//
// Possible errors: an `ip` or `sysctl` command's (not root, names taken).
func newTopology(prefix string) (*topology, error) {
	t := &topology{client: prefix + "-c", router: prefix + "-r", server: prefix + "-s"}
	cmds := [][]string{
		{"ip", "netns", "add", t.client},
		{"ip", "netns", "add", t.router},
		{"ip", "netns", "add", t.server},
		{"ip", "-n", t.router, "link", "add", routerClientDev, "type", "veth", "peer", "name", nsDev, "netns", t.client},
		{"ip", "-n", t.router, "link", "add", routerServerDev, "type", "veth", "peer", "name", nsDev, "netns", t.server},
		{"ip", "netns", "exec", t.router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"},
	}
	addr := func(ns, dev, a string) []string {
		return []string{"ip", "-n", ns, "addr", "add", a, "dev", dev, "nodad"}
	}
	cmds = append(cmds,
		addr(t.router, routerClientDev, routerClientV4+"/24"), addr(t.router, routerClientDev, routerClientV6+"/64"),
		addr(t.router, routerServerDev, routerServerV4+"/24"), addr(t.router, routerServerDev, routerServerV6+"/64"),
		addr(t.client, nsDev, clientV4+"/24"), addr(t.client, nsDev, clientV6+"/64"))
	for _, s := range []serverAddrs{serverV4, serverV6} {
		bits := "/24"
		if strings.Contains(s.allowed, ":") {
			bits = "/64"
		}
		for _, a := range []string{s.allowed, s.change, s.outside} {
			cmds = append(cmds, addr(t.server, nsDev, a+bits))
		}
	}
	for _, ns := range []string{t.client, t.router, t.server} {
		cmds = append(cmds, []string{"ip", "-n", ns, "link", "set", "lo", "up"})
	}
	cmds = append(cmds,
		[]string{"ip", "-n", t.router, "link", "set", routerClientDev, "up"},
		[]string{"ip", "-n", t.router, "link", "set", routerServerDev, "up"},
		[]string{"ip", "-n", t.client, "link", "set", nsDev, "up"},
		[]string{"ip", "-n", t.server, "link", "set", nsDev, "up"},
		[]string{"ip", "-n", t.client, "route", "add", "default", "via", routerClientV4},
		[]string{"ip", "-n", t.client, "-6", "route", "add", "default", "via", routerClientV6},
		[]string{"ip", "-n", t.server, "route", "add", "default", "via", routerServerV4},
		[]string{"ip", "-n", t.server, "-6", "route", "add", "default", "via", routerServerV6},
	)
	for _, c := range cmds {
		if err := run(c...); err != nil {
			t.remove()
			return nil, err
		}
	}
	return t, nil
}

// remove deletes the namespaces (and with them the veths).
func (t *topology) remove() {
	for _, ns := range []string{t.client, t.router, t.server} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// run runs a command and returns its output in the error when it fails.
func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
