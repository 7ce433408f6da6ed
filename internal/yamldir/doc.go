// SPDX-License-Identifier: Apache-2.0

// Package yamldir reads and watches a directory of YAML files, as the
// agent reads --policy-dir and --endpoint-dir: the files *.yaml and *.yml
// directly in the directory, hidden files and subdirectories ignored,
// symlinks followed only while they stay inside the directory (a
// Kubernetes ConfigMap mount), each file capped in size, and the whole
// directory read again when it changes (fsnotify, debounced) and
// periodically.
//
// It owns how the files are found, opened and watched, and nothing of
// what they hold: Dir.Read gives each file's content or why it could not
// be read, and Dir.Watch calls the reader's function to parse and apply
// them. A file is the unit of validity for the cells that use it: they
// keep, per file, the last version that was valid.
//
// Reads: the directory it is given. Writes: nothing.
package yamldir
