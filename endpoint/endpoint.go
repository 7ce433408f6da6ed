// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/labels"
)

const (
	// DefaultNamespace is the namespace of an endpoint that names none.
	DefaultNamespace = "default"

	// SourceK8s is the source of an endpoint's labels in its identity's
	// label set ("k8s:app=web"), as in Cilium.
	SourceK8s = "k8s"

	// NamespaceLabel is the label every endpoint's identity carries with
	// its namespace, as in Cilium.
	NamespaceLabel = "io.kubernetes.pod.namespace"

	// NamespaceLabelsPrefix prefixes the labels of an endpoint's namespace
	// in its identity's label set, as in Cilium.
	NamespaceLabelsPrefix = "io.cilium.k8s.namespace.labels."

	// NamespaceNameLabel is the label Kubernetes sets on every namespace
	// with its name.
	NamespaceNameLabel = "kubernetes.io/metadata.name"
)

// Endpoint is an endpoint as its source describes it.
type Endpoint struct {
	// Namespace and Name name the endpoint: "<namespace>/<name>".
	Namespace string `json:"namespace" yaml:"namespace"`
	Name      string `json:"name" yaml:"name"`

	// Labels are the endpoint's own labels (key -> value, as in
	// Kubernetes' metadata.labels).
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`

	// Addresses are the endpoint's addresses, at least one.
	Addresses []netip.Addr `json:"addresses" yaml:"addresses"`

	// Interface is the host-side device the endpoint sits behind; empty
	// if the source does not say.
	Interface string `json:"interface,omitempty" yaml:"interface,omitempty"`

	// Node is the node the endpoint runs on; empty means this node.
	Node string `json:"node,omitempty" yaml:"node,omitempty"`
}

// ID returns "<namespace>/<name>".
func (e Endpoint) ID() string { return e.Namespace + "/" + e.Name }

// IsLocal reports whether the endpoint runs on the node named nodeName.
func (e Endpoint) IsLocal(nodeName string) bool { return e.Node == "" || e.Node == nodeName }

// IdentityLabels returns the label set of the endpoint's identity: its
// labels as "k8s:<key>=<value>", its namespace as
// "k8s:io.kubernetes.pod.namespace=<namespace>", and the labels of its
// namespace (nsLabels, nil if unknown) as
// "k8s:io.cilium.k8s.namespace.labels.<key>=<value>".
//
// Possible errors: labels.ErrInvalidLabel (wrapped), for a key or value
// that cannot be part of a label (a comma, white space).
func (e Endpoint) IdentityLabels(nsLabels map[string]string) (labels.Labels, error) {
	all := make([]string, 0, len(e.Labels)+len(nsLabels)+1)
	for k, v := range e.Labels {
		all = append(all, Label(k, v))
	}
	for k, v := range nsLabels {
		all = append(all, Label(NamespaceLabelsPrefix+k, v))
	}
	all = append(all, Label(NamespaceLabel, e.Namespace))
	return labels.New(all...)
}

// Label returns the identity label of an endpoint label key=value:
// "k8s:<key>=<value>".
func Label(key, value string) string {
	return SourceK8s + ":" + key + "=" + value
}

// KeyValues returns the key=value pairs of a label set's k8s labels, the
// form selectors match: "k8s:app=web" is app -> web. The namespace's
// kubernetes.io/metadata.name label is there whether or not a Namespace
// document gave it: Kubernetes sets it on every namespace, and namespace
// selectors rely on it.
func KeyValues(l labels.Labels) map[string]string {
	kv := make(map[string]string)
	for lbl := range l.All() {
		rest, ok := strings.CutPrefix(lbl, SourceK8s+":")
		if !ok {
			continue
		}
		k, v, _ := strings.Cut(rest, "=")
		kv[k] = v
	}
	if ns, ok := kv[NamespaceLabel]; ok {
		if _, named := kv[NamespaceLabelsPrefix+NamespaceNameLabel]; !named {
			kv[NamespaceLabelsPrefix+NamespaceNameLabel] = ns
		}
	}
	return kv
}

// Namespace is a namespace as a `v1 Namespace` document describes it:
// its labels, which endpoints' identities and namespace selectors use.
type Namespace struct {
	Name   string            `json:"name" yaml:"name"`
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
}

// Node is a node as a `v1 Node` document describes it: its addresses
// are remote-node addresses unless it is this node.
type Node struct {
	Name      string       `json:"name" yaml:"name"`
	Addresses []netip.Addr `json:"addresses,omitempty" yaml:"addresses,omitempty"`
}

// SortedAddresses returns addrs sorted and without duplicates.
func SortedAddresses(addrs []netip.Addr) []netip.Addr {
	sorted := slices.Clone(addrs)
	slices.SortFunc(sorted, netip.Addr.Compare)
	return slices.Compact(sorted)
}
