package cells

import (
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
)

// healthCell provides the root cell.Health (each module gets a scope of it,
// see NewHive) and the `health` shell command that shows every scope's level
// and message.
var healthCell = cell.Provide(
	cell.NewSimpleHealth,
	func(h *cell.SimpleHealth) hive.ScriptCmdOut {
		return hive.NewScriptCmd("health", cell.SimpleHealthCmd(h))
	},
)
