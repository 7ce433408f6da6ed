// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/labels"
)

func TestIdentityLabels(t *testing.T) {
	ep := Endpoint{Namespace: "shop", Name: "web-1", Labels: map[string]string{"app": "web", "app.kubernetes.io/tier": "front"}}
	lbls, err := ep.IdentityLabels(map[string]string{"team": "a"})
	require.NoError(t, err)
	require.Equal(t, "k8s:app.kubernetes.io/tier=front,k8s:app=web,k8s:io.cilium.k8s.namespace.labels.team=a,k8s:io.kubernetes.pod.namespace=shop",
		lbls.String())
	require.Equal(t, map[string]string{
		"app": "web", "app.kubernetes.io/tier": "front",
		"io.cilium.k8s.namespace.labels.team": "a", "io.kubernetes.pod.namespace": "shop",
		// Implied, as Kubernetes sets it on every namespace.
		"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "shop",
	}, KeyValues(lbls))

	// A Namespace document's own name label is kept as it is.
	lbls, err = ep.IdentityLabels(map[string]string{"kubernetes.io/metadata.name": "shop"})
	require.NoError(t, err)
	require.Equal(t, "shop", KeyValues(lbls)["io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name"])
	require.NotContains(t, KeyValues(labels.ForPrefix(netip.MustParsePrefix("10.0.0.0/8"))),
		"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name", "not an endpoint's labels: no namespace")
}

func TestValidate(t *testing.T) {
	valid := Endpoint{Namespace: "shop", Name: "web-1.a", Labels: map[string]string{"app": "web", "k8s.io/x": ""},
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}, Interface: "veth0"}
	require.NoError(t, valid.Validate())

	for name, change := range map[string]func(e *Endpoint){
		"no address":        func(e *Endpoint) { e.Addresses = nil },
		"duplicate address": func(e *Endpoint) { e.Addresses = append(e.Addresses, e.Addresses[0]) },
		"mapped address":    func(e *Endpoint) { e.Addresses = []netip.Addr{netip.MustParseAddr("::ffff:10.0.0.1")} },
		"multicast":         func(e *Endpoint) { e.Addresses = []netip.Addr{netip.MustParseAddr("224.0.0.1")} },
		"upper-case name":   func(e *Endpoint) { e.Name = "Web" },
		"dotted namespace":  func(e *Endpoint) { e.Namespace = "a.b" },
		"label with comma":  func(e *Endpoint) { e.Labels = map[string]string{"app": "a,b"} },
		"label key slash":   func(e *Endpoint) { e.Labels = map[string]string{"/app": "a"} },
		"long interface":    func(e *Endpoint) { e.Interface = "a-very-long-device-name" },
		"bad node":          func(e *Endpoint) { e.Node = "Node_1" },
	} {
		e := valid
		e.Labels = map[string]string{"app": "web"}
		change(&e)
		require.ErrorIs(t, e.Validate(), ErrInvalid, name)
	}
}
