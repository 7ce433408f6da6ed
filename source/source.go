// SPDX-License-Identifier: Apache-2.0

// Package source names where ipcache metadata comes from, and orders the
// sources by precedence (Cilium's order): when several owners describe one
// prefix, the entry's source is the highest-precedence one present.
package source

import (
	"fmt"
	"strconv"
)

// Source is where metadata came from. It is a small number, not a name:
// every metadata row and ipcache entry holds one (a million of each at
// scale), and precedence is then a comparison. The zero value is no
// source, which Parse never returns and handles refuse.
type Source uint8

// The sources, highest precedence first.
const (
	KubeAPIServer Source = iota + 1
	Local
	KVStore
	CustomResource
	Kubernetes
	ClusterMesh
	Directory
	API
	Generated
	Restored
	Unspec
)

// names are the sources' names, by number.
var names = [...]string{
	KubeAPIServer:  "kube-apiserver",
	Local:          "local",
	KVStore:        "kvstore",
	CustomResource: "custom-resource",
	Kubernetes:     "k8s",
	ClusterMesh:    "clustermesh",
	Directory:      "directory",
	API:            "api",
	Generated:      "generated",
	Restored:       "restored",
	Unspec:         "unspec",
}

// Parse returns the source of the given name.
//
// Possible errors: ErrUnknownSource (wrapped, listing the known names).
func Parse(name string) (Source, error) {
	for s := KubeAPIServer; s <= Unspec; s++ {
		if names[s] == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w %q, want one of %v", ErrUnknownSource, name, names[KubeAPIServer:])
}

// Valid reports whether s is one of the sources.
func (s Source) Valid() bool { return s >= KubeAPIServer && s <= Unspec }

// Overrides reports whether s has strictly higher precedence than other.
// An invalid source has the lowest precedence.
func (s Source) Overrides(other Source) bool {
	return s.Valid() && (!other.Valid() || s < other)
}

// String returns the source's name.
func (s Source) String() string {
	if !s.Valid() {
		return "source(" + strconv.Itoa(int(s)) + ")"
	}
	return names[s]
}

// MarshalText implements encoding.TextMarshaler: the name (JSON, YAML).
//
// Possible errors: ErrUnknownSource (wrapped) for a value that is no source.
func (s Source) MarshalText() ([]byte, error) {
	if !s.Valid() {
		return nil, fmt.Errorf("%w %d", ErrUnknownSource, s)
	}
	return []byte(names[s]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, as Parse.
//
// Possible errors: ErrUnknownSource (wrapped) for a name that is no source.
func (s *Source) UnmarshalText(text []byte) error {
	parsed, err := Parse(string(text))
	if err != nil {
		return err
	}
	*s = parsed
	return nil
}
