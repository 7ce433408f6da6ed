// Package source names where ipcache metadata comes from, and orders the
// sources by precedence (Cilium's order): when several owners describe one
// prefix, the entry's source is the highest-precedence one present.
package source

import (
	"errors"
	"fmt"
	"slices"
)

// Source is where metadata came from.
type Source string

// The sources, highest precedence first.
const (
	KubeAPIServer  Source = "kube-apiserver"
	Local          Source = "local"
	KVStore        Source = "kvstore"
	CustomResource Source = "custom-resource"
	Kubernetes     Source = "k8s"
	ClusterMesh    Source = "clustermesh"
	Directory      Source = "directory"
	API            Source = "api"
	Generated      Source = "generated"
	Restored       Source = "restored"
	Unspec         Source = "unspec"
)

// byPrecedence lists every source, highest precedence first.
var byPrecedence = []Source{
	KubeAPIServer, Local, KVStore, CustomResource, Kubernetes, ClusterMesh,
	Directory, API, Generated, Restored, Unspec,
}

// ErrUnknownSource is returned (wrapped) by Parse for a name that is not a
// source.
var ErrUnknownSource = errors.New("unknown source")

// Parse returns the source of the given name.
//
// Possible errors: ErrUnknownSource (wrapped, listing the known names).
func Parse(name string) (Source, error) {
	s := Source(name)
	if !slices.Contains(byPrecedence, s) {
		return "", fmt.Errorf("%w %q, want one of %v", ErrUnknownSource, name, byPrecedence)
	}
	return s, nil
}

// rank is 0 for the highest precedence; unknown sources rank last.
func (s Source) rank() int {
	if i := slices.Index(byPrecedence, s); i >= 0 {
		return i
	}
	return len(byPrecedence)
}

// Overrides reports whether s has strictly higher precedence than other.
func (s Source) Overrides(other Source) bool { return s.rank() < other.rank() }

// String returns the source's name.
func (s Source) String() string { return string(s) }
