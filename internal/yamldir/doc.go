// SPDX-License-Identifier: Apache-2.0

// Package yamldir is a directory of YAML files as the agent reads
// --policy-dir and --endpoint-dir: the files *.yaml and *.yml directly in
// the directory, hidden files and subdirectories ignored, symlinks
// followed only while they stay inside the directory (a Kubernetes
// ConfigMap mount), each file capped in size (Dir.Read), a file unchanged
// since the last read taken again without reading it (Dir.ReadCached); read again when
// it changes (fsnotify, debounced) and periodically (Dir.Watch); a file
// the unit of validity, each keeping the last version of it that was
// valid, an emptied file keeping what it held (Versions); the versions in
// force saved in the state directory, so that a file invalid at start
// keeps the version in force before the restart (Saved).
//
// It owns how the files are found, read, watched, kept and saved, and
// nothing of what they hold: the cell that uses it gives the parser, what
// a file claims alone among the files (policy names; endpoint names and
// addresses), and applies the versions in force. README.md says how a cell
// puts the pieces together.
//
// Reads: the directory and the saved file it is given. Writes: the saved
// file (atomically).
package yamldir
