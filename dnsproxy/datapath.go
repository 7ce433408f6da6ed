// SPDX-License-Identifier: Apache-2.0

package dnsproxy

import (
	"context"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
)

// Datapath is what the agent's DNS proxy needs of the datapath (the
// datapath cell provides it; the fqdn cell uses it): where to tell the
// program the proxy's port, how to know that the ipcache map holds a
// change of the `ipcache` table, and the answers the program recorded
// while no proxy ran.
type Datapath interface {
	// WaitIPCacheWritten blocks until the writer of the ipcache map has
	// written (or failed to write) every change of the `ipcache` table up
	// to revision rev.
	WaitIPCacheWritten(ctx context.Context, rev statedb.Revision) error
	// SetDNSProxyPort tells the program the port of the proxy's sockets
	// (0: none, DNS goes to its servers).
	SetDNSProxyPort(port uint16) error
	// DNSAnswers returns the pinned ring of the answers that reached an
	// endpoint without the proxy (not to be closed).
	DNSAnswers() (*ebpf.Map, error)
}
