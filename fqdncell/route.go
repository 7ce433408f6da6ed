// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The program marks the DNS packets it steers to the proxy's socket with
// proxyMark under proxyMarkMask; a policy rule sends them to proxyTable,
// where every address is local, so that the stack delivers them to the
// socket the program assigned instead of forwarding them. The values are
// Cilium's (MARK_MAGIC_TO_PROXY, table 2004).
const (
	proxyMark     = 0x200
	proxyMarkMask = 0xf00
	proxyTable    = 2004
	// proxyRulePriority comes before the main table's rule (32766).
	proxyRulePriority = 9000
)

// installProxyRoutes adds the policy rule and the local routes of the
// steered packets, IPv4 and IPv6, in the agent's network namespace. What
// is there already stays.
//
// Possible errors: netlink's (not CAP_NET_ADMIN).
func installProxyRoutes() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rule := netlink.NewRule()
		rule.Family = family
		rule.Mark = proxyMark
		mask := uint32(proxyMarkMask)
		rule.Mask = &mask
		rule.Table = proxyTable
		rule.Priority = proxyRulePriority
		if err := netlink.RuleAdd(rule); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("add the rule fwmark %#x/%#x lookup %d: %w", proxyMark, proxyMarkMask, proxyTable, err)
		}
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if family == netlink.FAMILY_V6 {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		route := &netlink.Route{
			Family: family, Dst: dst, Type: unix.RTN_LOCAL, Table: proxyTable,
			LinkIndex: lo.Attrs().Index, Scope: unix.RT_SCOPE_HOST,
		}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("add the local route %s to table %d: %w", dst, proxyTable, err)
		}
	}
	return nil
}

// RemoveProxyRoutes removes, from the caller's network namespace, the
// policy rule and local routes installProxyRoutes adds (`cleanup`), and
// reports whether there were any.
//
// Possible errors: netlink's (not CAP_NET_ADMIN).
func RemoveProxyRoutes() (removed bool, err error) {
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := netlink.RuleList(family)
		if err != nil {
			return removed, fmt.Errorf("list the policy rules: %w", err)
		}
		for _, rule := range rules {
			if rule.Table != proxyTable || rule.Mark != proxyMark || rule.Priority != proxyRulePriority {
				continue
			}
			if err := netlink.RuleDel(&rule); err != nil && !errors.Is(err, syscall.ENOENT) {
				return removed, fmt.Errorf("remove the rule fwmark %#x lookup %d: %w", proxyMark, proxyTable, err)
			}
			removed = true
		}
		routes, err := netlink.RouteListFiltered(family, &netlink.Route{Table: proxyTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return removed, fmt.Errorf("list the routes of table %d: %w", proxyTable, err)
		}
		for _, route := range routes {
			if route.Type != unix.RTN_LOCAL {
				continue
			}
			if err := netlink.RouteDel(&route); err != nil && !errors.Is(err, syscall.ESRCH) {
				return removed, fmt.Errorf("remove the local route %s of table %d: %w", route.Dst, proxyTable, err)
			}
			removed = true
		}
	}
	return removed, nil
}
