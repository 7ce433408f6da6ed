// SPDX-License-Identifier: Apache-2.0

// Package nodecell owns the sources of the addresses of the `host` and
// `remote-node` entities (DESIGN: docs/CONTRACT.md, "Entities").
//
// It reads this node's addresses from netlink (every address of every
// link of the agent's network namespace, kept current by a subscription)
// and the `v1 Node` documents the endpoint directory hands it through
// [Nodes.SetNodes]. It writes each address into the ipcache as a /32 or
// /128 through two resource handles, "node/host" (source local) and
// "node/remote-node" (source directory), with the label
// "reserved:host" or "reserved:remote-node": the ipcache adds the
// address's cidr label, so the address has a local identity that CIDR
// rules select one by one and the entity selects by its reserved label.
// It holds the ipcache's initialization until the first listing of this
// node's addresses is in. It serves the `node/addresses` shell command.
package nodecell
