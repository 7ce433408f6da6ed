// SPDX-License-Identifier: Apache-2.0

package monitorcell

import "github.com/cilium/hive/cell"

// Cell provides the [Hub], which hands the enforcement program's events to
// subscribers, and the shell's monitor and datapath/events-lost commands.
// It reads the program through the events.Source the datapath provides.
var Cell = cell.Module(
	"monitor",
	"Enforcement program events and the monitor command",

	cell.Provide(newLifecycleHub, monitorScriptCommands),
)
