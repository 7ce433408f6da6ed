// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"fmt"
	"strings"
	"testing"
)

// kubectlPods is a `kubectl get pods -o yaml` List of n running pods, each
// with the fields kubectl prints (managedFields, containers, conditions).
func kubectlPods(n int) []byte {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n")
	for i := range n {
		fmt.Fprintf(&b, `- apiVersion: v1
  kind: Pod
  metadata:
    annotations:
      ipcache-agent.io/interface: lxc%[1]d
    creationTimestamp: "2026-12-01T10:00:00Z"
    generateName: web-7d9f8b6c5-
    labels:
      app: web
      app.kubernetes.io/name: web
      pod-template-hash: 7d9f8b6c5
    managedFields:
    - apiVersion: v1
      fieldsType: FieldsV1
      fieldsV1:
        f:metadata:
          f:labels:
            .: {}
            f:app: {}
      manager: kube-controller-manager
      operation: Update
      time: "2026-12-01T10:00:00Z"
    name: web-%[1]d
    namespace: shop
    resourceVersion: "%[1]d"
    uid: 9a1b2c3d-4e5f-6a7b-8c9d-%012[1]d
  spec:
    containers:
    - image: nginx:1.27
      name: nginx
      ports:
      - containerPort: 80
        protocol: TCP
      resources: {}
    nodeName: node-a
    restartPolicy: Always
  status:
    conditions:
    - lastTransitionTime: "2026-12-01T10:00:01Z"
      status: "True"
      type: Ready
    hostIP: 192.168.1.10
    phase: Running
    podIP: 10.%[2]d.%[3]d.%[4]d
    podIPs:
    - ip: 10.%[2]d.%[3]d.%[4]d
    - ip: fd00::%[1]x
    startTime: "2026-12-01T10:00:00Z"
`, i, i>>16&0xff, i>>8&0xff, i&0xff)
	}
	return []byte(b.String())
}

// BenchmarkParsePods parses a kubectl List of 1,000 pods.
func BenchmarkParsePods(b *testing.B) {
	content := kubectlPods(1000)
	b.SetBytes(int64(len(content)))
	b.ReportAllocs()
	for b.Loop() {
		docs, err := Parse("pods.yaml", content)
		if err != nil {
			b.Fatal(err)
		}
		if len(docs.Endpoints) != 1000 {
			b.Fatalf("%d endpoints, want 1000", len(docs.Endpoints))
		}
	}
}

// TestKubectlPodsWithinBudget: a kubectl List of many pods, one document,
// is within the node budget of its file, and within MaxSize.
func TestKubectlPodsWithinBudget(t *testing.T) {
	content := kubectlPods(1000)
	docs, err := Parse("pods.yaml", content)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs.Endpoints) != 1000 || len(content) > MaxSize {
		t.Fatalf("%d endpoints of %d bytes", len(docs.Endpoints), len(content))
	}
}

// TestNodeBudget: a file of tiny nodes is rejected at the first node over
// its budget, saying so.
func TestNodeBudget(t *testing.T) {
	content := []byte("a: [" + strings.Repeat("1,", 10000) + "]\n")
	_, err := Parse("tiny.yaml", content)
	want := fmt.Sprintf("tiny.yaml:1: invalid endpoint file: more YAML values, lists and mappings in a document than a file of %d bytes may have (%d: one per 4 bytes, plus 4096)",
		len(content), nodeBudget(len(content)))
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}
