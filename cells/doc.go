// Package cells composes ipcache-agent from its cells and holds the small
// cells every agent needs and no cell owns: logging, health, the shell, and
// the owner lock that makes one agent at a time the owner of a state
// directory and of the pins under a bpffs root.
//
// [NewHive] builds a hive from [Infrastructure] and the given cells; the
// agent runs [ControlPlane].
// An agent that embeds ipcache-agent builds its own hive from the same
// groups plus its own cells.
package cells
