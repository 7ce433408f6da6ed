// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
)

// Peers by label and by entity through the real binary (DESIGN.md
// sections 10 and 11): TCP connections to db, an endpoint of namespace
// shop, from endpoints of two namespaces, from this node's own namespace
// and from addresses of a peer namespace that no device of an endpoint
// leads to (another node's address, a remote endpoint's, the world's),
// with policies that select those peers by label, by namespace and by
// entity. Every scenario sees a connection it allows go through and one it
// does not dropped, so none passes by enforcing nothing.

// vethNamespace makes the namespace <e.epNS>-<suffix> behind a veth whose
// host side, device with hostAddr/24, is in the host side's namespace:
// its eth0 has addr/24 and its default route goes through hostAddr. It
// returns the namespace's name.
func (e *e2e) vethNamespace(suffix, device, hostAddr, addr string) string {
	t := e.t
	t.Helper()
	ns := e.epNS + "-" + suffix
	mustRun(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { mustRunQuiet("ip", "netns", "del", ns) })
	mustRun(t, "ip", "-n", e.hostNS, "link", "add", device, "type", "veth", "peer", "name", "eth0", "netns", ns)
	mustRun(t, "ip", "-n", e.hostNS, "addr", "add", hostAddr+"/24", "dev", device)
	mustRun(t, "ip", "-n", e.hostNS, "link", "set", device, "up")
	mustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	mustRun(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
	mustRun(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	mustRun(t, "ip", "-n", ns, "route", "add", "default", "via", hostAddr)
	return ns
}

// The network of the peer tests, beside web (e2e's endpoint, 10.201.0.2)
// and db (10.201.5.2): two more endpoints' namespaces, each behind its own
// device, and a peer namespace behind a device of no endpoint, whose
// loopback holds the addresses of the peers that are not local endpoints.
// The host side routes between them all.
const (
	shopOtherAddr   = "10.211.1.2" // shop/other
	otherWebAddr    = "10.211.2.2" // other/web
	otherOtherAddr  = "10.211.3.2" // other/other
	peerLinkAddr    = "10.211.9.2"
	remoteNodeAddr  = "10.212.0.1" // node-b's, from its Node document
	remoteEPAddr    = "10.212.0.2" // shop/rweb's, on node-b
	worldAddr       = "10.212.0.3" // nothing's
	ownNodeDocAddr  = "10.212.0.4" // what node-a's own Node document says: this node's
	peerLoopbacks   = "10.212.0.0/24"
	dbPort          = 8080
	dbOtherPort     = 8081
	peersNodeName   = "node-a" // newEndpointsE2E's --node-name
	peersRemoteNode = "node-b"
)

// peerEndpoint is an Endpoint document of the endpoint directory, in a
// file of its own.
type peerEndpoint struct {
	namespace, name string
	labels          map[string]string
	addr            string
	device, node    string // "" if none
}

func (p peerEndpoint) file() string { return p.namespace + "-" + p.name + ".yaml" }

func (p peerEndpoint) doc() string {
	var lbls []string
	for _, k := range slices.Sorted(maps.Keys(p.labels)) {
		lbls = append(lbls, fmt.Sprintf("%q: %q", k, p.labels[k]))
	}
	spec := "addresses: [" + p.addr + "]"
	if p.device != "" {
		spec += ", interface: " + p.device
	}
	if p.node != "" {
		spec += ", node: " + p.node
	}
	return fmt.Sprintf("apiVersion: ipcache-agent.io/v1\nkind: Endpoint\nmetadata: {name: %s, namespace: %s, labels: {%s}}\nspec: {%s}\n",
		p.name, p.namespace, strings.Join(lbls, ", "), spec)
}

// peersCluster is what the endpoint directory says of the cluster beside
// the endpoints: the namespaces' labels (shop has pci, other has not) and
// two nodes, this one (whose Node document's address is a host address,
// as Cilium has it, not a remote node's) and node-b.
var peersCluster = fmt.Sprintf(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: shop, labels: {team: a, pci: "true"}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: other, labels: {team: b}}
- apiVersion: v1
  kind: Node
  metadata: {name: %s}
  status: {addresses: [{type: InternalIP, address: %s}]}
- apiVersion: v1
  kind: Node
  metadata: {name: %s}
  status: {addresses: [{type: InternalIP, address: %s}, {type: Hostname, address: %s}]}
`, peersNodeName, ownNodeDocAddr, peersRemoteNode, remoteNodeAddr, peersRemoteNode)

// peersNamespaceLabels are the namespace labels of peersCluster, as an
// endpoint's identity carries them.
var peersNamespaceLabels = map[string][]string{
	"shop":  {"k8s:io.cilium.k8s.namespace.labels.team=a", "k8s:io.cilium.k8s.namespace.labels.pci=true"},
	"other": {"k8s:io.cilium.k8s.namespace.labels.team=b"},
}

// peerClient is where a probe comes from: a namespace, and the source
// address there ("": the route's).
type peerClient struct{ name, ns, src string }

// peersRig is the agent and the network of the peer tests.
type peersRig struct {
	*endpointsE2E
	args []string
	// The clients: the endpoints of the two namespaces, this node (the
	// host side's namespace, where the agent runs) and the peer
	// namespace's addresses.
	web, shopOther, otherWeb, otherOther          peerClient
	host, remoteNode, remoteEP, world, ownNodeDoc peerClient
	// endpoints are the endpoint directory's endpoints by file.
	endpoints map[string]peerEndpoint
}

func newPeersRig(t *testing.T) *peersRig {
	e := newEndpointsE2E(t)
	r := &peersRig{endpointsE2E: e, args: slices.Clone(e.extraArgs), endpoints: map[string]peerEndpoint{}}
	// Endpoints reach each other through the host side.
	mustRun(t, "ip", "netns", "exec", e.hostNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	shopOtherNS := e.vethNamespace("o", "ipcal1", "10.211.1.1", shopOtherAddr)
	otherWebNS := e.vethNamespace("w", "ipcal2", "10.211.2.1", otherWebAddr)
	otherOtherNS := e.vethNamespace("x", "ipcal3", "10.211.3.1", otherOtherAddr)
	peerNS := e.vethNamespace("p", "ipcal9", "10.211.9.1", peerLinkAddr)
	for _, addr := range []string{remoteNodeAddr, remoteEPAddr, worldAddr, ownNodeDocAddr} {
		mustRun(t, "ip", "-n", peerNS, "addr", "add", addr+"/32", "dev", "lo")
	}
	mustRun(t, "ip", "-n", e.hostNS, "route", "add", peerLoopbacks, "via", peerLinkAddr)
	r.web = peerClient{"shop/web", e.epNS, ""}
	r.shopOther = peerClient{"shop/other", shopOtherNS, ""}
	r.otherWeb = peerClient{"other/web", otherWebNS, ""}
	r.otherOther = peerClient{"other/other", otherOtherNS, ""}
	r.host = peerClient{"host", e.hostNS, ""}
	r.remoteNode = peerClient{"remote node", peerNS, remoteNodeAddr}
	r.remoteEP = peerClient{"remote endpoint", peerNS, remoteEPAddr}
	r.world = peerClient{"world", peerNS, worldAddr}
	r.ownNodeDoc = peerClient{"own Node doc", peerNS, ownNodeDocAddr}

	for _, port := range []int{dbPort, dbOtherPort} {
		netnstest.EchoTCP(t, e.dbNS, net.JoinHostPort(dbAddr, fmt.Sprint(port)))
	}
	// Before any agent every client connects.
	for _, c := range []peerClient{r.web, r.shopOther, r.otherWeb, r.otherOther, r.host, r.remoteNode, r.remoteEP, r.world, r.ownNodeDoc} {
		p := r.tcp(c, dbPort, connected)
		require.Eventually(t, func() bool { return p.run() == connected }, 10*time.Second, 50*time.Millisecond,
			"%s before any agent runs", p.what)
	}

	e.endpointFile("cluster.yaml", peersCluster)
	for _, ep := range []peerEndpoint{
		{namespace: "shop", name: "web", labels: map[string]string{"app": "web"}, addr: epAddr, device: e2eDevice},
		{namespace: "shop", name: "db", labels: map[string]string{"app": "db"}, addr: dbAddr, device: dbDevice},
		{namespace: "shop", name: "other", labels: map[string]string{"app": "other"}, addr: shopOtherAddr, device: "ipcal1"},
		{namespace: "other", name: "web", labels: map[string]string{"app": "web"}, addr: otherWebAddr, device: "ipcal2"},
		{namespace: "other", name: "other", labels: map[string]string{"app": "other"}, addr: otherOtherAddr, device: "ipcal3"},
		{namespace: "shop", name: "rweb", labels: map[string]string{"app": "rweb"}, addr: remoteEPAddr, node: peersRemoteNode},
	} {
		r.endpoints[ep.file()] = ep
		e.endpointFile(ep.file(), ep.doc())
	}
	return r
}

// tcp is a connection from c to db's port.
func (r *peersRig) tcp(c peerClient, port int, want string) probe {
	p := tcpFrom(r.t, c.ns, c.src, net.JoinHostPort(dbAddr, fmt.Sprint(port)), want)
	p.what = fmt.Sprintf("TCP %s -> db:%d", c.name, port)
	return p
}

// toDB is a connection from each client to db's port dbPort.
func (r *peersRig) toDB(want string, clients ...peerClient) []probe {
	var probes []probe
	for _, c := range clients {
		probes = append(probes, r.tcp(c, dbPort, want))
	}
	return probes
}

// scenario points the rig at the subtest t, with the agent running.
func (r *peersRig) scenario(t *testing.T) { r.e2e.scenario(t, r.args...) }

// setEndpoint rewrites ep's file and waits until the agent has every
// endpoint as the directory says.
func (r *peersRig) setEndpoint(ep peerEndpoint) {
	r.t.Helper()
	r.endpoints[ep.file()] = ep
	r.endpointFile(ep.file(), ep.doc())
	r.waitEndpoints()
}

// waitEndpoints waits until the agent lists exactly the rig's endpoints,
// each with its labels and its namespace's, and the pinned ipcache maps
// each one's address to its identity.
func (r *peersRig) waitEndpoints() {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := r.shell("endpoint/list", "-o", "json")
		if r.endpointsListed(out) {
			return
		}
		if time.Now().After(deadline) {
			require.FailNow(r.t, "endpoints not as the directory says", "endpoint/list: %s\nagent log:\n%s", out, r.agentLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// endpointsListed reports whether endpoint/list's JSON (out) and the
// pinned ipcache show the rig's endpoints, as waitEndpoints waits for.
func (r *peersRig) endpointsListed(out string) bool {
	r.t.Helper()
	var listed []struct {
		Name, Namespace string
		Labels          map[string]string
		Identity        uint32
		IdentityLabels  []string
		Local           bool
	}
	require.NoError(r.t, json.Unmarshal([]byte(out), &listed), "endpoint/list: %s", out)
	if len(listed) != len(r.endpoints) {
		return false
	}
	pinned := r.pinnedIPCache()
	for _, l := range listed {
		ep, ok := r.endpoints[l.Namespace+"-"+l.Name+".yaml"]
		if !ok || !maps.Equal(ep.labels, l.Labels) || l.Identity < 256 || l.Local != (ep.node == "") ||
			uint32(pinned[netip.MustParsePrefix(ep.addr+"/32")]) != l.Identity {
			return false
		}
		for _, nsLabel := range peersNamespaceLabels[ep.namespace] {
			if !slices.Contains(l.IdentityLabels, nsLabel) {
				return false
			}
		}
	}
	return true
}

// dbPolicy is a policy of shop on db (by its labels) with ingress rules.
func dbPolicy(kind, ingress string) string {
	switch kind {
	case "CiliumClusterwideNetworkPolicy":
		return "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: db}\n" +
			"spec:\n  endpointSelector: {matchLabels: {app: db}}\n  ingress:\n" + ingress
	case "NetworkPolicy":
		return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db, namespace: shop}\n" +
			"spec:\n  podSelector: {matchLabels: {app: db}}\n  policyTypes: [Ingress]\n  ingress:\n" + ingress
	}
	return "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: db, namespace: shop}\n" +
		"spec:\n  endpointSelector: {matchLabels: {app: db}}\n  ingress:\n" + ingress
}

// TestPrivilegedLabelPeers: peers by label (fromEndpoints, also after a
// label change), namespace scoping (CNP, CCNP, a selector naming the
// namespace), NetworkPolicy podSelector and namespaceSelector peers (alone,
// in one peer, in two; matchExpressions), a remote endpoint, and the
// entities cluster, remote-node and host. One agent, the scenarios one
// after another, each with the policy directory's whole content replaced.
// A connection policy does not allow is dropped as no-policy (db's ingress
// is default deny), which the first scenario checks in the counters and
// the monitor.
func TestPrivilegedLabelPeers(t *testing.T) {
	t.Parallel()
	r := newPeersRig(t)
	r.e2e.scenario(t, r.args...)
	r.waitEndpoints()

	// fromEndpoints by label: web may connect to db's port 8080, on no
	// other port; other, which has other labels, may not; relabelled to
	// app=web it may, relabelled back it may not again.
	t.Run("fromEndpoints by label", func(t *testing.T) {
		r.scenario(t)
		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy", `  - fromEndpoints: [{matchLabels: {app: web}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
`)})
		r.expect(r.tcp(r.web, dbPort, connected), r.tcp(r.web, dbOtherPort, timedOut),
			r.tcp(r.shopOther, dbPort, timedOut), r.tcp(r.world, dbPort, timedOut))

		// The drop is the program's, of other's identity, counted and
		// shown by the monitor.
		other, ok := r.endpoint("shop/other")
		require.True(t, ok)
		drops := r.startMonitor("drop")
		before := r.endpointDrops("ingress", "no-policy")
		require.Eventually(t, func() bool {
			r.tcp(r.shopOther, dbPort, timedOut).run()
			for _, ev := range drops.events() {
				if ev["src"] == shopOtherAddr && ev["dst"] == dbAddr && ev["direction"] == "ingress" &&
					ev["reason"] == "no-policy" && ev["identity"] == float64(other.Identity) && ev["device"] == dbDevice {
					return true
				}
			}
			return false
		}, 10*time.Second, 20*time.Millisecond, "the monitor shows other's connection dropped: %s", drops.out)
		require.Greater(t, r.endpointDrops("ingress", "no-policy"), before, "datapath/counters:\n%s", r.shell("datapath/counters"))

		r.setEndpoint(peerEndpoint{namespace: "shop", name: "other", labels: map[string]string{"app": "web"}, addr: shopOtherAddr, device: "ipcal1"})
		r.expect(r.tcp(r.shopOther, dbPort, connected), r.tcp(r.shopOther, dbOtherPort, timedOut), r.tcp(r.web, dbPort, connected))
		r.setEndpoint(peerEndpoint{namespace: "shop", name: "other", labels: map[string]string{"app": "other"}, addr: shopOtherAddr, device: "ipcal1"})
		r.expect(r.tcp(r.shopOther, dbPort, timedOut), r.tcp(r.web, dbPort, connected))
	})

	// A CNP's selector that names no namespace selects in the policy's; a
	// CCNP's in every namespace; a CNP's that names one, in that one.
	t.Run("namespace scoping", func(t *testing.T) {
		r.scenario(t)
		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy", "  - fromEndpoints: [{matchLabels: {app: web}}]\n")})
		r.expect(append(r.toDB(connected, r.web), r.toDB(timedOut, r.otherWeb, r.shopOther)...)...)

		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumClusterwideNetworkPolicy", "  - fromEndpoints: [{matchLabels: {app: web}}]\n")})
		r.expect(append(r.toDB(connected, r.web, r.otherWeb), r.toDB(timedOut, r.shopOther, r.otherOther)...)...)

		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy",
			"  - fromEndpoints: [{matchLabels: {app: web, \"k8s:io.kubernetes.pod.namespace\": other}}]\n")})
		r.expect(append(r.toDB(connected, r.otherWeb), r.toDB(timedOut, r.web, r.otherOther)...)...)
	})

	// NetworkPolicy peers, with Kubernetes' semantics: a podSelector alone
	// selects in the policy's namespace, a namespaceSelector alone every
	// endpoint of the namespaces it selects, both in one peer the
	// endpoints matching both, two peers either.
	t.Run("NetworkPolicy podSelector and namespaceSelector", func(t *testing.T) {
		for _, c := range []struct {
			name, from       string
			allowed, dropped []peerClient
		}{
			{"podSelector", "[{podSelector: {matchLabels: {app: web}}}]",
				[]peerClient{r.web}, []peerClient{r.otherWeb, r.shopOther}},
			{"namespaceSelector", "[{namespaceSelector: {matchLabels: {team: b}}}]",
				[]peerClient{r.otherWeb, r.otherOther}, []peerClient{r.web, r.shopOther}},
			{"namespaceSelector by metadata.name", "[{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: other}}}]",
				[]peerClient{r.otherWeb, r.otherOther}, []peerClient{r.web, r.shopOther}},
			{"both in one peer", "[{namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: web}}}]",
				[]peerClient{r.otherWeb}, []peerClient{r.otherOther, r.web}},
			{"two peers", "[{namespaceSelector: {matchLabels: {team: b}}}, {podSelector: {matchLabels: {app: web}}}]",
				[]peerClient{r.otherWeb, r.otherOther, r.web}, []peerClient{r.shopOther}},
			{"matchExpressions In", "[{podSelector: {matchExpressions: [{key: app, operator: In, values: [web, other]}]}}]",
				[]peerClient{r.web, r.shopOther}, []peerClient{r.otherWeb}},
			{"matchExpressions NotIn", "[{podSelector: {matchExpressions: [{key: app, operator: NotIn, values: [web]}]}}]",
				[]peerClient{r.shopOther}, []peerClient{r.web, r.otherOther}},
			{"matchExpressions Exists", "[{namespaceSelector: {matchExpressions: [{key: pci, operator: Exists}]}}]",
				[]peerClient{r.web, r.shopOther}, []peerClient{r.otherWeb}},
			{"matchExpressions DoesNotExist", "[{namespaceSelector: {matchExpressions: [{key: pci, operator: DoesNotExist}]}}]",
				[]peerClient{r.otherWeb}, []peerClient{r.web}},
		} {
			t.Run(c.name, func(t *testing.T) {
				r.scenario(t)
				r.usePolicies(map[string]string{"db.yaml": dbPolicy("NetworkPolicy", "  - from: "+c.from+"\n")})
				r.expect(append(r.toDB(connected, c.allowed...), r.toDB(timedOut, c.dropped...)...)...)
			})
		}
	})

	// A remote endpoint (another node's, known from its Endpoint
	// document) is selected by its labels; another address of the same
	// namespace is not.
	t.Run("remote endpoint", func(t *testing.T) {
		r.scenario(t)
		rweb, ok := r.endpoint("shop/rweb")
		require.True(t, ok)
		require.False(t, rweb.Local)
		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy", "  - fromEndpoints: [{matchLabels: {app: rweb}}]\n")})
		r.expect(append(r.toDB(connected, r.remoteEP), r.toDB(timedOut, r.world, r.web)...)...)
	})

	// The entities: cluster is every endpoint, local and remote, this
	// node and the other nodes, and not the world; remote-node the
	// addresses of other nodes' Node documents (not of this node's own);
	// host this node's namespace's addresses (the agent runs there) and
	// those of this node's Node document.
	t.Run("entities", func(t *testing.T) {
		r.scenario(t)
		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy", "  - fromEntities: [cluster]\n")})
		r.expect(append(r.toDB(connected, r.web, r.otherWeb, r.remoteEP, r.remoteNode, r.host, r.ownNodeDoc),
			r.toDB(timedOut, r.world)...)...)

		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy", "  - fromEntities: [remote-node]\n")})
		r.expect(append(r.toDB(connected, r.remoteNode), r.toDB(timedOut, r.world, r.ownNodeDoc, r.host, r.web)...)...)

		r.usePolicies(map[string]string{"db.yaml": dbPolicy("CiliumNetworkPolicy", "  - fromEntities: [host]\n")})
		r.expect(append(r.toDB(connected, r.host, r.ownNodeDoc), r.toDB(timedOut, r.remoteNode, r.world, r.web)...)...)
	})
}

// TestPrivilegedLabelPeerRelabelNoLoss: web pings db every millisecond
// while web is relabelled, round after round, between two label sets that
// db's policy allows (app In [x, y]): each relabel gives web a new
// identity, and not one probe is lost. Relabelled to a third, web's
// pings are dropped, so the policy is enforced throughout. Not parallel,
// for the probe rate (see mbb_test.go).
func TestPrivilegedLabelPeerRelabelNoLoss(t *testing.T) {
	e := newEndpointsE2E(t)
	mustRun(t, "ip", "netns", "exec", e.hostNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	web := func(app string) string { return endpointDoc("web", app, epAddr, e2eDevice) }
	e.endpointFile("web.yaml", web("x"))
	e.endpointFile("db.yaml", endpointDoc("db", "db", dbAddr, dbDevice))
	e.policyFile("db.yaml", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: db, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: db}}
  ingress:
  - fromEndpoints: [{matchExpressions: [{key: app, operator: In, values: [x, y]}]}]
`)
	e.startAgent()
	e.expect(pingProbe(e.epNS, dbAddr, answered), pingProbe(e.hostNS, dbAddr, lost))

	// A lost probe's drop, as the program saw it, for the report.
	drops := e.startMonitor("drop")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("drops the monitor showed:\n%s", drops.out)
		}
	})
	webPrefix := netip.MustParsePrefix(epAddr + "/32")
	for round := range 10 {
		app := []string{"y", "x"}[round%2]
		ipcache, _ := e.state()
		before := ipcache[webPrefix]
		e.pingDuring(fmt.Sprintf("round %d: web relabelled app=%s", round, app), e.epNS, dbAddr,
			func() { e.endpointFile("web.yaml", web(app)) },
			func(ipcache map[netip.Prefix]uint32, _ [2]bool) bool {
				now, ok := ipcache[webPrefix]
				return ok && now != before && now >= 256
			})
	}
	e.endpointFile("web.yaml", web("z"))
	e.expect(pingProbe(e.epNS, dbAddr, lost))
	e.endpointFile("web.yaml", web("x"))
	e.expect(pingProbe(e.epNS, dbAddr, answered))
}
