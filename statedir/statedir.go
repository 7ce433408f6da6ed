// SPDX-License-Identifier: Apache-2.0

package statedir

import (
	"os"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
)

// Config is the state directory's configuration.
type Config struct {
	// StateDir holds the files the cells keep across restarts; empty keeps
	// none.
	StateDir string
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{StateDir: "/run/ipcache-agent"}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("state-dir", def.StateDir,
		"Directory for state kept across restarts (identity checkpoint)")
}

// File is a file a cell keeps in the state directory, by its name there.
// Removing the state (`cleanup`) removes it and its set-aside copy
// ([AsideName]).
type File struct {
	Name        string
	Description string
}

// FileOut is what a constructor returns to declare a file it keeps in the
// state directory: it joins the hive's "state-files" value group.
type FileOut struct {
	cell.Out

	File File `group:"state-files"`
}

// Files are the files the cells of a hive declared, in no particular
// order.
type Files struct {
	cell.In

	Files []File `group:"state-files"`
}

// AsideName is the name (or path) of a state file once [SetAside] moved
// it aside.
func AsideName(name string) string { return name + ".corrupt" }

// SetAside renames the file at path to [AsideName](path), replacing an
// older one, so that the next write starts afresh while the content that
// could not be decoded is kept to look at. It returns the new path.
//
// Possible errors: those of the rename.
func SetAside(path string) (string, error) {
	aside := AsideName(path)
	return aside, os.Rename(path, aside)
}
