// SPDX-License-Identifier: Apache-2.0

// Package statedir is the agent's state directory (--state-dir): the one
// configuration the cells that keep files across restarts share, the
// declaration each of them makes of its files there, and how a file that
// cannot be decoded is set aside.
//
// The composition (package cells) provides [Config] once; a cell that
// keeps a file in the directory provides a [FileOut] naming it, and
// whoever must know every file (the `cleanup` command) reads [Files]
// instead of a list of its own.
//
// Owns: the --state-dir flag and the name of a set-aside file.
// Reads and writes: nothing but the file [SetAside] renames.
package statedir
