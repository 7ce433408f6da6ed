// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	epHead  = "apiVersion: ipcache-agent.io/v1\nkind: Endpoint\n"
	podHead = "apiVersion: v1\nkind: Pod\n"
)

// TestParseRejects: every error rejects the whole file, at its position,
// saying what is wrong.
func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		// Documents.
		{"YAML syntax", "a: [\n", `bad.yaml:2:1: invalid endpoint file: YAML: unterminated flow collection: the file ends before its closing bracket`},
		{"not a mapping", "- a\n", `bad.yaml:1:1: invalid endpoint file: document: want a mapping, got a list`},
		{"no apiVersion", "kind: Endpoint\n", `bad.yaml:1:1: invalid endpoint file: document: apiVersion is required`},
		{"no kind", "apiVersion: v1\n", `bad.yaml:1:1: invalid endpoint file: document: kind is required`},
		{"kind not a value", "apiVersion: v1\nkind: [Pod]\n", `bad.yaml:2:7: invalid endpoint file: kind: want a value, got a list`},
		{"unknown kind", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n", `bad.yaml:1:1: invalid endpoint file: document: apiVersion "v1", kind "Service" is not a document this agent reads: want ipcache-agent.io/v1 Endpoint, or v1 Pod, Namespace, Node or List`},
		{"native kind, core version", "apiVersion: v1\nkind: Endpoint\n", `bad.yaml:1:1: invalid endpoint file: document: apiVersion "v1", kind "Endpoint" is not a document this agent reads: want ipcache-agent.io/v1 Endpoint, or v1 Pod, Namespace, Node or List`},
		{"list in list", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items: []\n", `bad.yaml:4:3: invalid endpoint file: items[0]: apiVersion "v1", kind "List" is not a document this agent reads: want ipcache-agent.io/v1 Endpoint, or v1 Pod, Namespace, Node or List`},
		{"list without items", "apiVersion: v1\nkind: List\n", `bad.yaml:1:1: invalid endpoint file: List: items is required`},
		{"list items not a list", "apiVersion: v1\nkind: List\nitems: {a: b}\n", `bad.yaml:3:8: invalid endpoint file: items: want a list, got a mapping`},
		{"bad item", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}, status: {podIP: 10.0.0.1}}\n- {apiVersion: v1, kind: Pod, metadata: {name: b}, status: {podIP: 10.0.0.300}}\n", `bad.yaml:5:68: invalid endpoint file: Pod "default/b": status.podIP: "10.0.0.300" is not an IP address`},

		// The native Endpoint.
		{"unknown field", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1]}\nstatus: {}\n", `bad.yaml:5:1: invalid endpoint file: Endpoint: unknown field "status", want one of apiVersion, kind, metadata, spec`},
		{"unknown metadata field", epHead + "metadata: {name: a, annotations: {}}\nspec: {addresses: [10.0.0.1]}\n", `bad.yaml:3:21: invalid endpoint file: metadata: unknown field "annotations", want one of name, namespace, labels`},
		{"unknown spec field", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1], device: eth0}\n", `bad.yaml:4:31: invalid endpoint file: Endpoint "default/a": spec: unknown field "device", want one of addresses, interface, node`},
		{"no metadata", epHead + "spec: {addresses: [10.0.0.1]}\n", `bad.yaml:1:1: invalid endpoint file: Endpoint: metadata is required (with a name)`},
		{"metadata not a mapping", epHead + "metadata: a\n", `bad.yaml:3:11: invalid endpoint file: metadata: want a mapping, got "a"`},
		{"no name", epHead + "metadata: {namespace: a}\n", `bad.yaml:3:11: invalid endpoint file: metadata.name is required`},
		{"bad name", epHead + "metadata: {name: Web}\n", `bad.yaml:3:18: invalid endpoint file: metadata.name: "Web": character 'W' not allowed, want lower-case letters, digits, '-' or '.'`},
		{"bad name part", epHead + "metadata: {name: a..b}\n", `bad.yaml:3:18: invalid endpoint file: metadata.name: "a..b": each part between dots must start and end with a letter or digit`},
		{"long name", epHead + "metadata: {name: " + strings.Repeat("a", 254) + "}\n", `bad.yaml:3:18: invalid endpoint file: metadata.name: "` + strings.Repeat("a", 254) + `" is longer than 253 characters`},
		{"bad namespace", epHead + "metadata: {name: a, namespace: a.b}\n", `bad.yaml:3:32: invalid endpoint file: metadata.namespace: "a.b": character '.' not allowed, want lower-case letters, digits or '-'`},
		{"no spec", epHead + "metadata: {name: a}\n", `bad.yaml:1:1: invalid endpoint file: Endpoint "default/a": spec is required (with addresses)`},
		{"no addresses", epHead + "metadata: {name: a}\nspec: {interface: eth0}\n", `bad.yaml:4:7: invalid endpoint file: Endpoint "default/a": spec.addresses is required`},
		{"null addresses", epHead + "metadata: {name: a}\nspec: {addresses: ~}\n", `bad.yaml:4:7: invalid endpoint file: Endpoint "default/a": spec.addresses is required`},
		{"empty addresses", epHead + "metadata: {name: a}\nspec: {addresses: []}\n", `bad.yaml:4:19: invalid endpoint file: Endpoint "default/a": spec.addresses: at least one address is required`},
		{"addresses not a list", epHead + "metadata: {name: a}\nspec: {addresses: 10.0.0.1}\n", `bad.yaml:4:19: invalid endpoint file: Endpoint "default/a": spec.addresses: want a list, got "10.0.0.1"`},
		{"bad address", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1, 10.0.0.256]}\n", `bad.yaml:4:30: invalid endpoint file: Endpoint "default/a": spec.addresses[1]: "10.0.0.256" is not an IP address`},
		{"prefix", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.0/24]}\n", `bad.yaml:4:20: invalid endpoint file: Endpoint "default/a": spec.addresses[0]: "10.0.0.0/24" is not an IP address`},
		{"unspecified address", epHead + "metadata: {name: a}\nspec: {addresses: [\"::\"]}\n", `bad.yaml:4:20: invalid endpoint file: Endpoint "default/a": spec.addresses[0]: "::": an unspecified or multicast address is not an endpoint's`},
		{"multicast address", epHead + "metadata: {name: a}\nspec: {addresses: [224.0.0.1]}\n", `bad.yaml:4:20: invalid endpoint file: Endpoint "default/a": spec.addresses[0]: "224.0.0.1": an unspecified or multicast address is not an endpoint's`},
		{"zone", epHead + "metadata: {name: a}\nspec: {addresses: [\"fe80::1%eth0\"]}\n", `bad.yaml:4:20: invalid endpoint file: Endpoint "default/a": spec.addresses[0]: "fe80::1%eth0": an address with a zone is not an endpoint's`},
		{"address twice", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1, \"::ffff:10.0.0.1\"]}\n", `bad.yaml:4:30: invalid endpoint file: Endpoint "default/a": address 10.0.0.1 is given twice`},
		{"address a list", epHead + "metadata: {name: a}\nspec: {addresses: [[10.0.0.1]]}\n", `bad.yaml:4:20: invalid endpoint file: Endpoint "default/a": spec.addresses[0]: want a value, got a list`},
		{"long interface", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1], interface: a-very-long-name0}\n", `bad.yaml:4:42: invalid endpoint file: Endpoint "default/a": spec.interface: "a-very-long-name0" is longer than 15 characters`},
		{"bad interface", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1], interface: \"eth0:1\"}\n", `bad.yaml:4:42: invalid endpoint file: Endpoint "default/a": spec.interface: "eth0:1": character ':' not allowed in a device name`},
		{"bad node", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1], node: Node_B}\n", `bad.yaml:4:37: invalid endpoint file: Endpoint "default/a": spec.node: "Node_B": character 'N' not allowed, want lower-case letters, digits, '-' or '.'`},

		// Labels.
		{"labels not a mapping", epHead + "metadata: {name: a, labels: [app]}\n", `bad.yaml:3:29: invalid endpoint file: Endpoint "default/a": metadata.labels: want a mapping, got a list`},
		{"label value not a string", epHead + "metadata: {name: a, labels: {version: 1.0}}\n", `bad.yaml:3:39: invalid endpoint file: Endpoint "default/a": metadata.labels.version: want a string, got "1.0" (quote it)`},
		{"label value null", epHead + "metadata: {name: a, labels: {app: }}\n", `bad.yaml:3:35: invalid endpoint file: Endpoint "default/a": metadata.labels.app: want a string, got nothing (quote it)`},
		{"label key not a string", epHead + "metadata: {name: a, labels: {1: a}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: want a string, got "1" (quote it)`},
		{"label key bad character", epHead + "metadata: {name: a, labels: {\"a b\": c}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: key "a b": character ' ' not allowed, want letters, digits, '-', '_' or '.'`},
		{"label key empty prefix", epHead + "metadata: {name: a, labels: {/app: c}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: key "/app": the prefix before '/' must not be empty`},
		{"label key bad prefix", epHead + "metadata: {name: a, labels: {Example.com/app: c}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: key prefix: "Example.com": character 'E' not allowed, want lower-case letters, digits, '-' or '.'`},
		{"label key two slashes", epHead + "metadata: {name: a, labels: {a/b/c: c}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: key "a/b/c": at most one '/' (between a prefix and the name)`},
		{"label key empty name", epHead + "metadata: {name: a, labels: {example.com/: c}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: key "example.com/": the name must not be empty`},
		{"label key long name", epHead + "metadata: {name: a, labels: {" + strings.Repeat("k", 64) + ": c}}\n", `bad.yaml:3:30: invalid endpoint file: Endpoint "default/a": metadata.labels: key "` + strings.Repeat("k", 64) + `" is longer than 63 characters`},
		{"label value bad start", epHead + "metadata: {name: a, labels: {app: -web}}\n", `bad.yaml:3:35: invalid endpoint file: Endpoint "default/a": metadata.labels.app: value "-web" must start and end with a letter or digit`},
		{"label value long", epHead + "metadata: {name: a, labels: {app: " + strings.Repeat("v", 64) + "}}\n", `bad.yaml:3:35: invalid endpoint file: Endpoint "default/a": metadata.labels.app: value "` + strings.Repeat("v", 64) + `" is longer than 63 characters`},
		{"label value bad character", epHead + "metadata: {name: a, labels: {app: \"a/b\"}}\n", `bad.yaml:3:35: invalid endpoint file: Endpoint "default/a": metadata.labels.app: value "a/b": character '/' not allowed, want letters, digits, '-', '_' or '.'`},

		// Pods.
		{"pod without status", podHead + "metadata: {name: a}\nspec: {nodeName: n}\n", `bad.yaml:1:1: invalid endpoint file: Pod "default/a": status.podIPs and status.podIP: no address (a pod that is not running yet has none)`},
		{"pod without address", podHead + "metadata: {name: a}\nstatus: {phase: Pending}\n", `bad.yaml:4:9: invalid endpoint file: Pod "default/a": status.podIPs and status.podIP: no address (a pod that is not running yet has none)`},
		{"pod bad podIP", podHead + "metadata: {name: a}\nstatus: {podIP: x}\n", `bad.yaml:4:17: invalid endpoint file: Pod "default/a": status.podIP: "x" is not an IP address`},
		{"pod bad podIPs", podHead + "metadata: {name: a}\nstatus: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.1}, {ip: y}]}\n", `bad.yaml:4:57: invalid endpoint file: Pod "default/a": status.podIPs[1].ip: "y" is not an IP address`},
		{"pod podIPs item without ip", podHead + "metadata: {name: a}\nstatus: {podIPs: [{}]}\n", `bad.yaml:4:19: invalid endpoint file: Pod "default/a": status.podIPs[0].ip is required`},
		{"pod podIPs not a list", podHead + "metadata: {name: a}\nstatus: {podIPs: 10.0.0.1}\n", `bad.yaml:4:18: invalid endpoint file: Pod "default/a": status.podIPs: want a list, got "10.0.0.1"`},
		{"pod status not a mapping", podHead + "metadata: {name: a}\nstatus: Running\n", `bad.yaml:4:9: invalid endpoint file: Pod "default/a": status: want a mapping, got "Running"`},
		{"pod spec not a mapping", podHead + "metadata: {name: a}\nspec: []\n", `bad.yaml:4:7: invalid endpoint file: Pod "default/a": spec: want a mapping, got a list`},
		{"pod bad nodeName", podHead + "metadata: {name: a}\nspec: {nodeName: \"-\"}\nstatus: {podIP: 10.0.0.1}\n", `bad.yaml:4:18: invalid endpoint file: Pod "default/a": spec.nodeName: "-": each part between dots must start and end with a letter or digit`},
		{"pod bad interface annotation", podHead + "metadata: {name: a, annotations: {ipcache-agent.io/interface: \"a b\"}}\nstatus: {podIP: 10.0.0.1}\n", `bad.yaml:3:63: invalid endpoint file: Pod "default/a": metadata.annotations.ipcache-agent.io/interface: "a b": character ' ' not allowed in a device name`},
		{"pod annotations not a mapping", podHead + "metadata: {name: a, annotations: x}\nstatus: {podIP: 10.0.0.1}\n", `bad.yaml:3:34: invalid endpoint file: Pod "default/a": metadata.annotations: want a mapping, got "x"`},
		{"pod bad label", podHead + "metadata: {name: a, labels: {app: true}}\nstatus: {podIP: 10.0.0.1}\n", `bad.yaml:3:35: invalid endpoint file: Pod "default/a": metadata.labels.app: want a string, got "true" (quote it)`},

		// Namespaces and nodes.
		{"namespace with a dot", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a.b}\n", `bad.yaml:3:18: invalid endpoint file: metadata.name: "a.b": character '.' not allowed, want lower-case letters, digits or '-'`},
		{"namespace bad label", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {team: \"x y\"}}\n", `bad.yaml:3:36: invalid endpoint file: Namespace "a": metadata.labels.team: value "x y": character ' ' not allowed, want letters, digits, '-', '_' or '.'`},
		{"node bad address", "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: nope}]}\n", `bad.yaml:4:50: invalid endpoint file: Node "n": status.addresses[0].address: "nope" is not an IP address`},
		{"node address missing", "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: ExternalIP}]}\n", `bad.yaml:4:22: invalid endpoint file: Node "n": status.addresses[0].address is required`},
		{"node addresses not a list", "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {addresses: {}}\n", `bad.yaml:4:21: invalid endpoint file: Node "n": status.addresses: want a list, got a mapping`},

		// Across documents.
		{"same endpoint twice", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1]}\n---\n" + podHead + "metadata: {name: a, namespace: default}\nstatus: {podIP: 10.0.0.2}\n", `bad.yaml:8:18: invalid endpoint file: Pod "default/a": endpoint "default/a" is already described at line 3`},
		{"same address twice", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1, \"fd00::1\"]}\n---\n" + epHead + "metadata: {name: b}\nspec:\n  addresses:\n  - \"fd00:0::1\"\n", `bad.yaml:11:5: invalid endpoint file: Endpoint "default/b": address fd00::1 is already endpoint "default/a"'s, at line 4`},
		{"same namespace twice", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n", `bad.yaml:7:18: invalid endpoint file: Namespace "a": namespace "a" is already described at line 3`},
		{"same node twice", "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: a}\n", `bad.yaml:7:18: invalid endpoint file: Node "a": node "a" is already described at line 3`},
		{"error after good documents", epHead + "metadata: {name: a}\nspec: {addresses: [10.0.0.1]}\n---\nkind: Endpoint\n", `bad.yaml:6:1: invalid endpoint file: document: apiVersion is required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := Parse("bad.yaml", []byte(tc.content))
			require.Error(t, err)
			require.Equal(t, Documents{}, docs)
			require.Equal(t, tc.want, err.Error())
			require.ErrorIs(t, err, ErrInvalidFile)
			var ferr *FileError
			require.True(t, errors.As(err, &ferr))
			require.Equal(t, "bad.yaml", ferr.File)
		})
	}
}
