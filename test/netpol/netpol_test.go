// SPDX-License-Identifier: Apache-2.0

package netpol

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/endpointcell"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

// world is the scenarios' cluster: hello (the server) and curl in
// namespace default; curl1 and curl2 beside them; curl in namespace
// second (labelled namespace=second); kube-dns in kube-system (labelled
// namespace=k8s). Addresses outside are the internet.
const world = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: default}
- apiVersion: v1
  kind: Namespace
  metadata: {name: second, labels: {namespace: second}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: kube-system, labels: {namespace: k8s}}
- apiVersion: v1
  kind: Pod
  metadata: {name: hello, namespace: default, labels: {app: hello}}
  status: {podIP: 10.0.0.10}
- apiVersion: v1
  kind: Pod
  metadata: {name: curl, namespace: default, labels: {run: curl}}
  status: {podIP: 10.0.0.20}
- apiVersion: v1
  kind: Pod
  metadata: {name: curl1, namespace: default, labels: {run: curl1}}
  status: {podIP: 10.0.0.21}
- apiVersion: v1
  kind: Pod
  metadata: {name: curl2, namespace: default, labels: {run: curl2}}
  status: {podIP: 10.0.0.22}
- apiVersion: v1
  kind: Pod
  metadata: {name: curl, namespace: second, labels: {run: curl}}
  status: {podIP: 10.0.1.20}
- apiVersion: v1
  kind: Pod
  metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
  status: {podIP: 10.0.2.53}
`

// Addresses of the world.
const (
	hello      = "10.0.0.10"
	curl       = "10.0.0.20"
	curl1      = "10.0.0.21"
	curl2      = "10.0.0.22"
	curlSecond = "10.0.1.20"
	dns        = "10.0.2.53"
	internet   = "198.51.100.1"
)

// verdict is one expectation: traffic of endpoint `of` (namespace/name)
// with peer address `peer` in direction dir on proto/port.
type verdict struct {
	of, peer, dir, port string
	allow               bool
}

func TestNetworkPolicySemantics(t *testing.T) {
	scenarios := []struct {
		name     string
		policies string
		verdicts []verdict
	}{{
		name: "no policy allows everything",
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
			{"default/curl", internet, "egress", "TCP/443", true},
		},
	}, {
		name: "podSelector {} without rules denies all ingress in its namespace",
		policies: netpol("deny-all", "default", "{}", `
  policyTypes: [Ingress]`),
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", false},
			{"default/hello", curlSecond, "ingress", "TCP/80", false},
			{"default/hello", internet, "egress", "TCP/80", true},
			{"second/curl", curl, "ingress", "TCP/80", true}, // another namespace's pods are not selected
		},
	}, {
		name: "a podSelector peer is the policy's namespace only",
		policies: netpol("allow-curl", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {run: curl}}`),
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "TCP/80", false},
			{"default/hello", curl1, "ingress", "TCP/80", false},
			{"default/hello", internet, "ingress", "TCP/80", false},
		},
	}, {
		name: "podSelector and namespaceSelector {} in one peer: those pods of every namespace",
		policies: netpol("any-namespace", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {run: curl}}
      namespaceSelector: {}`),
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
			{"default/hello", curl1, "ingress", "TCP/80", false},
			{"default/hello", internet, "ingress", "TCP/80", false},
		},
	}, {
		name: "namespaceSelector by a namespace label: every pod of those namespaces",
		policies: netpol("from-second", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {namespace: second}}`),
		verdicts: []verdict{
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
			{"default/hello", curl, "ingress", "TCP/80", false},
			{"default/hello", dns, "ingress", "TCP/80", false},
		},
	}, {
		name: "namespaceSelector by kubernetes.io/metadata.name, which every namespace has",
		policies: netpol("from-kube-system", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}`),
		verdicts: []verdict{
			{"default/hello", dns, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "TCP/80", false},
		},
	}, {
		name: "two peers are OR",
		policies: netpol("or", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {run: curl1}}
    - podSelector: {matchLabels: {run: curl2}}`),
		verdicts: []verdict{
			{"default/hello", curl1, "ingress", "TCP/80", true},
			{"default/hello", curl2, "ingress", "TCP/80", true},
			{"default/hello", curl, "ingress", "TCP/80", false},
		},
	}, {
		name: "podSelector and namespaceSelector in one peer are AND",
		policies: netpol("and", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {run: curl}}
      namespaceSelector: {matchLabels: {namespace: second}}`),
		verdicts: []verdict{
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
			{"default/hello", curl, "ingress", "TCP/80", false},
			{"default/hello", dns, "ingress", "TCP/80", false},
		},
	}, {
		name: "matchExpressions In, NotIn and Exists in a peer",
		policies: netpol("exprs", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector:
        matchExpressions:
        - {key: run, operator: In, values: [curl1, curl2]}
        - {key: run, operator: NotIn, values: [curl2]}
        - {key: run, operator: Exists}`),
		verdicts: []verdict{
			{"default/hello", curl1, "ingress", "TCP/80", true},
			{"default/hello", curl2, "ingress", "TCP/80", false},
			{"default/hello", curl, "ingress", "TCP/80", false},
		},
	}, {
		name: "an empty from allows every source",
		policies: netpol("empty-from", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from: []`),
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "UDP/53", true},
			{"default/hello", internet, "ingress", "TCP/22", true},
		},
	}, {
		name: "an empty ingress denies every source",
		policies: netpol("empty-ingress", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress: []`),
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", false},
			{"default/hello", internet, "ingress", "TCP/80", false},
			{"default/curl", hello, "ingress", "TCP/80", true}, // not selected
		},
	}, {
		name: "an allow-all policy wins over a narrower one (policies add up)",
		policies: netpol("block-hello", "default", "{matchLabels: {app: hello}}", `
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: frontend}}`) + "---\n" + netpol("allow-all", "default", "{}", `
  policyTypes: [Ingress]
  ingress:
  - {}`),
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
		},
	}, {
		name: "egress to every pod blocks the internet",
		policies: netpol("egress-pods", "default", "{}", `
  policyTypes: [Egress]
  egress:
  - to:
    - podSelector: {}`),
		verdicts: []verdict{
			{"default/curl", hello, "egress", "TCP/80", true},
			{"default/curl", curlSecond, "egress", "TCP/80", false}, // podSelector {} is this namespace's pods
			{"default/curl", internet, "egress", "TCP/80", false},
		},
	}, {
		name: "egress to every namespace's pods still blocks the internet",
		policies: netpol("egress-cluster", "default", "{matchLabels: {run: curl}}", `
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {}`),
		verdicts: []verdict{
			{"default/curl", hello, "egress", "TCP/80", true},
			{"default/curl", curlSecond, "egress", "TCP/80", true},
			{"default/curl", internet, "egress", "TCP/80", false},
		},
	}, {
		name: "egress to pods and to DNS on any destination",
		policies: netpol("balance", "default", "{matchLabels: {run: curl}}", `
  policyTypes: [Egress]
  egress:
  - to:
    - podSelector: {matchLabels: {app: hello}}
  - ports:
    - {protocol: UDP, port: 53}`),
		verdicts: []verdict{
			{"default/curl", hello, "egress", "TCP/80", true},
			{"default/curl", dns, "egress", "UDP/53", true},
			{"default/curl", internet, "egress", "UDP/53", true},
			{"default/curl", dns, "egress", "TCP/53", false},
			{"default/curl", curl1, "egress", "TCP/80", false},
		},
	}, {
		name: "DNS only to a namespace chosen by its label",
		policies: netpol("specific-dns", "default", "{matchLabels: {run: curl}}", `
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {namespace: k8s}}
    ports:
    - {protocol: UDP, port: 53}`),
		verdicts: []verdict{
			{"default/curl", dns, "egress", "UDP/53", true},
			{"default/curl", internet, "egress", "UDP/53", false},
			{"default/curl", dns, "egress", "TCP/80", false},
		},
	}, {
		name: "a port without a number is every port of its protocol",
		policies: netpol("all-tcp", "default", "{matchLabels: {run: curl}}", `
  policyTypes: [Egress]
  egress:
  - to:
    - podSelector: {}
    - ipBlock: {cidr: 0.0.0.0/0}
    ports:
    - protocol: TCP`),
		verdicts: []verdict{
			{"default/curl", internet, "egress", "TCP/443", true},
			{"default/curl", hello, "egress", "TCP/8080", true},
			{"default/curl", internet, "egress", "UDP/53", false},
		},
	}, {
		name: "CiliumNetworkPolicy fromEndpoints is the policy's namespace unless it names one",
		policies: `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: same-ns, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: hello}}
  ingress:
  - fromEndpoints: [{matchLabels: {run: curl}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: named-ns, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: hello}}
  ingress:
  - fromEndpoints: [{matchLabels: {"k8s:io.kubernetes.pod.namespace": kube-system}}]
`,
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curl, "ingress", "TCP/81", false},
			{"default/hello", curlSecond, "ingress", "TCP/80", false},
			{"default/hello", dns, "ingress", "TCP/9153", true},
		},
	}, {
		name: "CiliumClusterwideNetworkPolicy fromEndpoints is every namespace; {} every endpoint, not the internet",
		policies: `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: curl-anywhere}
spec:
  endpointSelector: {matchLabels: {app: hello}}
  ingress:
  - fromEndpoints: [{matchLabels: {run: curl}}]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: dns-from-all}
spec:
  endpointSelector: {matchLabels: {k8s-app: kube-dns}}
  ingress:
  - fromEndpoints: [{}]
`,
		verdicts: []verdict{
			{"default/hello", curl, "ingress", "TCP/80", true},
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
			{"default/hello", curl1, "ingress", "TCP/80", false},
			{"kube-system/coredns", curl1, "ingress", "UDP/53", true},
			{"kube-system/coredns", internet, "ingress", "UDP/53", false},
		},
	}, {
		name: "the cluster entity is every endpoint and no internet address",
		policies: `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cluster-only, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: hello}}
  ingress:
  - fromEntities: [cluster]
`,
		verdicts: []verdict{
			{"default/hello", curlSecond, "ingress", "TCP/80", true},
			{"default/hello", dns, "ingress", "TCP/80", true},
			{"default/hello", internet, "ingress", "TCP/80", false},
		},
	}}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			explain := startControlPlane(t, sc.policies)
			for _, v := range sc.verdicts {
				out := explain(v)
				m := regexp.MustCompile(`(?m)^Verdict: (allow|drop)`).FindStringSubmatch(out)
				require.NotNil(t, m, "no verdict for %+v:\n%s", v, out)
				require.Equal(t, v.allow, m[1] == "allow", "%s -> %s %s %s:\n%s", v.of, v.peer, v.dir, v.port, out)
			}
		})
	}
}

// netpol returns a NetworkPolicy document.
func netpol(name, namespace, podSelector, rest string) string {
	return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: " + name + ", namespace: " + namespace +
		"}\nspec:\n  podSelector: " + podSelector + rest + "\n"
}

// startControlPlane runs the control plane over the world and the
// policies, waits until its tables are complete, and returns a function
// that runs policy/explain for a verdict.
func startControlPlane(t *testing.T, policies string) func(verdict) string {
	t.Helper()
	epDir, policyDir, stateDir := t.TempDir(), t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(epDir, "world.yaml"), []byte(world), 0o644))
	if policies != "" {
		require.NoError(t, os.WriteFile(filepath.Join(policyDir, "policies.yaml"), []byte(policies), 0o644))
	}
	log := hivetest.Logger(t)
	h := cells.NewHive(
		identitycell.Cell,
		ipcachecell.Cell,
		endpointcell.Cell,
		policycell.Cell,
		cell.Provide(func() policy.MapCapacity { return policycell.DefaultPolicyMapMaxEntries }),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	for name, value := range map[string]string{"state-dir": stateDir, "policy-dir": policyDir,
		"endpoint-dir": epDir, "node-name": "node-a"} {
		require.NoError(t, flags.Set(name, value))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, h.Start(log, ctx))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	cmds, err := h.ScriptCommands(log)
	require.NoError(t, err)
	engine := &script.Engine{Cmds: cmds}
	run := func(line string) (string, error) {
		state, err := script.NewState(ctx, t.TempDir(), nil)
		require.NoError(t, err)
		var log strings.Builder
		if err := engine.Execute(state, "", bufio.NewReader(strings.NewReader(line+"\n")), &log); err != nil {
			return log.String(), err
		}
		return state.Stdout(), nil
	}
	// The tables are complete once initialized; every endpoint has an
	// identity by then (the directory is read before initialization).
	_, err = run("db/initialized policy policy-enforcement endpoints")
	require.NoError(t, err)
	// Every document is in force: a rejected file would leave the
	// verdicts to no policy at all.
	if policies != "" {
		out, err := run("db/show policies")
		require.NoError(t, err)
		docs := strings.Count(policies, "\n---\n") + 1
		require.Equal(t, docs, strings.Count(strings.TrimSpace(out), "\n"), "policies in force:\n%s", out)
	}
	return func(v verdict) string {
		out, err := run("policy/explain --endpoint " + v.of + " " + v.peer + " " + v.dir + " " + v.port)
		require.NoError(t, err, out)
		return out
	}
}
