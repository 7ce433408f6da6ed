// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"github.com/cilium/hive/cell"

	"github.com/ipcache-agent/ipcache-agent/events"
)

// Cell provides the [Hub], which hands the enforcement program's events to
// subscribers, and the shell's monitor and datapath/events-lost commands.
// It reads the program through the events.Source the datapath provides.
// The Hub is also the events.DNSPublisher the DNS proxy publishes its
// events to.
var Cell = cell.Module(
	"monitor",
	"Enforcement program events and the monitor command",

	cell.Provide(newLifecycleHub, monitorScriptCommands, dnsPublisher),
)

// dnsPublisher provides the hub to the DNS proxy as its interface only.
func dnsPublisher(h *Hub) events.DNSPublisher { return h }
