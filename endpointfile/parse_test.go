// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// TestParse: each kind gives what it describes.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          Documents
	}{
		{"native endpoint",
			"apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: web-1, namespace: shop, labels: {app: web}}\n" +
				"spec:\n  addresses: [10.0.1.5, \"fd00::5\"]\n  interface: veth-web1\n  node: node-b\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "shop", Name: "web-1", Labels: map[string]string{"app": "web"},
				Addresses: addrs("10.0.1.5", "fd00::5"), Interface: "veth-web1", Node: "node-b"}}}},
		{"native endpoint defaults",
			"apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: vm-1}\nspec: {addresses: [\"::ffff:10.0.0.9\"]}\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "default", Name: "vm-1", Addresses: addrs("10.0.0.9")}}}},
		{"native endpoint, null optional fields",
			"apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: vm-1, namespace: null, labels: ~}\nspec: {addresses: [10.0.0.9], interface: null, node: ~}\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "default", Name: "vm-1", Addresses: addrs("10.0.0.9")}}}},
		{"labels as Kubernetes allows",
			"apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata:\n  name: a\n  labels:\n    app.kubernetes.io/name: My_App.v1\n    empty: \"\"\n    \"version\": \"1.0\"\n" +
				"spec: {addresses: [10.0.0.1]}\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "default", Name: "a",
				Labels:    map[string]string{"app.kubernetes.io/name": "My_App.v1", "empty": "", "version": "1.0"},
				Addresses: addrs("10.0.0.1")}}}},
		{"pod with podIPs",
			"apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-1\n  namespace: shop\n  labels: {app: web}\n  annotations: {ipcache-agent.io/interface: lxc12, other: 3}\n" +
				"spec: {nodeName: node-a, containers: [{name: c, image: i}]}\nstatus: {podIP: 10.0.1.5, podIPs: [{ip: 10.0.1.5}, {ip: \"fd00::5\"}]}\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "shop", Name: "web-1", Labels: map[string]string{"app": "web"},
				Addresses: addrs("10.0.1.5", "fd00::5"), Interface: "lxc12", Node: "node-a"}}}},
		{"pod with podIP only",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: web-1}\nstatus: {podIP: 10.0.1.5, podIPs: []}\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "default", Name: "web-1", Addresses: addrs("10.0.1.5")}}}},
		{"host network and ended pods are no endpoints",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {hostNetwork: true}\nstatus: {podIP: 192.168.1.1}\n---\n" +
				"apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {hostNetwork: true}\nstatus: {podIP: 192.168.1.1}\n---\n" +
				"apiVersion: v1\nkind: Pod\nmetadata: {name: c}\nstatus: {phase: Failed, podIP: 10.0.0.1}\n---\n" +
				"apiVersion: v1\nkind: Pod\nmetadata: {name: d}\nstatus: {phase: Succeeded, podIP: 10.0.0.1}\n---\n" +
				"apiVersion: v1\nkind: Pod\nmetadata: {name: e}\nstatus: {phase: Running, podIP: 10.0.0.1}\n",
			Documents{Endpoints: []endpoint.Endpoint{{Namespace: "default", Name: "e", Addresses: addrs("10.0.0.1")}}}},
		{"namespace",
			"apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {team: a, kubernetes.io/metadata.name: other}}\nspec: {finalizers: [kubernetes]}\n---\n" +
				"apiVersion: v1\nkind: Namespace\nmetadata: {name: bare}\n",
			Documents{Namespaces: []endpoint.Namespace{
				{Name: "shop", Labels: map[string]string{"team": "a", "kubernetes.io/metadata.name": "shop"}},
				{Name: "bare", Labels: map[string]string{"kubernetes.io/metadata.name": "bare"}}}}},
		{"node",
			"apiVersion: v1\nkind: Node\nmetadata: {name: node-b}\nstatus:\n  addresses:\n  - {type: InternalIP, address: 192.168.1.11}\n" +
				"  - {type: Hostname, address: node-b}\n  - {type: ExternalIP, address: \"2001:db8::1\"}\n  - {type: InternalIP, address: 192.168.1.11}\n---\n" +
				"apiVersion: v1\nkind: Node\nmetadata: {name: node-c}\n",
			Documents{Nodes: []endpoint.Node{{Name: "node-b", Addresses: addrs("192.168.1.11", "2001:db8::1")}, {Name: "node-c"}}}},
		{"list of every kind",
			"apiVersion: v1\nkind: List\nmetadata: {resourceVersion: \"\"}\nitems:\n" +
				"- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}\n" +
				"- {apiVersion: v1, kind: Node, metadata: {name: n}}\n" +
				"- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: shop}, status: {podIP: 10.0.0.2}}\n" +
				"- {apiVersion: ipcache-agent.io/v1, kind: Endpoint, metadata: {name: e}, spec: {addresses: [10.0.0.3]}}\n",
			Documents{
				Endpoints: []endpoint.Endpoint{
					{Namespace: "shop", Name: "p", Addresses: addrs("10.0.0.2")},
					{Namespace: "default", Name: "e", Addresses: addrs("10.0.0.3")}},
				Namespaces: []endpoint.Namespace{{Name: "shop", Labels: map[string]string{"kubernetes.io/metadata.name": "shop"}}},
				Nodes:      []endpoint.Node{{Name: "n"}}}},
		{"same name in another namespace",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nstatus: {podIP: 10.0.0.1}\n---\n" +
				"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: b}\nstatus: {podIP: 10.0.0.2}\n",
			Documents{Endpoints: []endpoint.Endpoint{
				{Namespace: "a", Name: "p", Addresses: addrs("10.0.0.1")},
				{Namespace: "b", Name: "p", Addresses: addrs("10.0.0.2")}}}},
		{"empty file", "", Documents{}},
		{"empty documents", "---\n# nothing\n---\n", Documents{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("f.yaml", []byte(tc.content))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestParseKubectl: files as `kubectl get -o yaml` prints them, with every
// field kubectl prints, read for what matters.
func TestParseKubectl(t *testing.T) {
	read := func(name string) Documents {
		content, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err)
		docs, err := Parse(name, content)
		require.NoError(t, err)
		return docs
	}
	require.Equal(t, Documents{Endpoints: []endpoint.Endpoint{
		{Namespace: "shop", Name: "web-7d9f8b6c5-x2x4q", Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8b6c5"},
			Addresses: addrs("10.0.1.5", "fd00::5"), Interface: "veth-web1", Node: "node-a"},
		{Namespace: "shop", Name: "db-0", Addresses: addrs("10.0.2.8"), Node: "node-b"},
	}}, read("pods.yaml"))
	require.Equal(t, Documents{
		Namespaces: []endpoint.Namespace{{Name: "shop", Labels: map[string]string{"kubernetes.io/metadata.name": "shop", "team": "payments"}}},
		Nodes:      []endpoint.Node{{Name: "node-b", Addresses: addrs("192.168.1.11", "2001:db8::11")}},
	}, read("cluster.yaml"))
}
