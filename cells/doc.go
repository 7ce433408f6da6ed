// Package cells composes ipcache-agent from its cells and holds the small
// cells every agent needs and no cell owns: logging and health.
//
// [NewHive] builds the agent's hive from [Infrastructure] and [ControlPlane].
// An agent that embeds ipcache-agent builds its own hive from the same
// groups plus its own cells.
package cells
