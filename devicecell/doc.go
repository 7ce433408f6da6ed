// SPDX-License-Identifier: Apache-2.0

// Package devicecell keeps the `devices` table: the network devices of the
// agent's network namespace as the kernel reports them over netlink (name,
// ifindex, kind, whether Ethernet, whether up), as Cilium's devices
// controller does.
//
// It owns the `devices` table and is its only writer. It reads netlink
// only: it lists the links at start and after any error of its
// subscription, and applies the link updates of the subscription in
// between, so the table follows devices that come, go and come back under
// the same name. Readers (the datapath, which attaches its program to the
// devices it selects) watch the table; it is initialized once the first
// listing is in.
package devicecell
