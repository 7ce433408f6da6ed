// Package cells composes ipcache-agent from its cells and holds the small
// cells every agent needs and no cell owns: logging and health.
//
// [NewHive] builds a hive from [Infrastructure] and the given cells; the
// agent runs [ControlPlane].
// An agent that embeds ipcache-agent builds its own hive from the same
// groups plus its own cells.
package cells
