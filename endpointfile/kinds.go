// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/internal/yamlread"
)

// The API versions and kinds of the documents an endpoint file may hold
// (DESIGN.md section 10).
const (
	apiVersionNative = "ipcache-agent.io/v1"
	apiVersionCore   = "v1"
	kindEndpoint     = "Endpoint"
	kindPod          = "Pod"
	kindNamespace    = "Namespace"
	kindNode         = "Node"
	kindList         = "List"

	// InterfaceAnnotation is the annotation of a Pod that names the device
	// it sits behind.
	InterfaceAnnotation = "ipcache-agent.io/interface"
)

// document parses one object; inList is the place of an item in a List
// ("" at the top).
func (p *parser) document(n yamlread.Node, inList string) error {
	p.current = ""
	what := inList
	if what == "" {
		what = "document"
	}
	if err := p.mapping(n, what, false); err != nil {
		return err
	}
	var typeMeta [2]string
	for i, name := range []string{"apiVersion", "kind"} {
		value, ok := n.Get(name)
		if !ok {
			return p.errorf(n, "%s: %s is required", what, name)
		}
		s, err := p.scalar(value, name)
		if err != nil {
			return err
		}
		typeMeta[i] = s
	}
	switch apiVersion, kind := typeMeta[0], typeMeta[1]; {
	case apiVersion == apiVersionNative && kind == kindEndpoint:
		return p.nativeEndpoint(n)
	case apiVersion == apiVersionCore && kind == kindPod:
		return p.pod(n)
	case apiVersion == apiVersionCore && kind == kindNamespace:
		return p.namespace(n)
	case apiVersion == apiVersionCore && kind == kindNode:
		return p.node(n)
	case apiVersion == apiVersionCore && kind == kindList && inList == "":
		return p.kubernetesList(n)
	}
	return p.errorf(n, "%s: apiVersion %q, kind %q is not a document this agent reads: want %s %s, or %s %s, %s, %s or %s",
		what, typeMeta[0], typeMeta[1], apiVersionNative, kindEndpoint, apiVersionCore, kindPod, kindNamespace, kindNode, kindList)
}

// kubernetesList parses a `kind: List`: its items are documents of their
// own, as `kubectl get -o yaml` prints several objects.
func (p *parser) kubernetesList(n yamlread.Node) error {
	itemsNode, ok := n.Get("items")
	if !ok {
		return p.errorf(n, "List: items is required")
	}
	items, err := p.list(itemsNode, "items")
	if err != nil {
		return err
	}
	for i, item := range items {
		if err := p.document(item, fmt.Sprintf("items[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// objectMeta is what this agent reads of an object's metadata.
type objectMeta struct {
	name, namespace string
	// nameNode is where the object is, for errors about it as a whole.
	nameNode yamlread.Node
	labels   map[string]string
	// annotations is set when the metadata has annotations.
	annotations    yamlread.Node
	hasAnnotations bool
}

// metadata reads a document's metadata: name (required), namespace (when
// namespaced; "default" when absent, as kubectl applies it in the default
// context), labels, and annotations (unread). With strict, any other field
// is an error; without, it is skipped, as kubectl prints many.
func (p *parser) metadata(doc yamlread.Node, kind string, namespaced, strict bool) (objectMeta, error) {
	metaNode, ok := doc.Get("metadata")
	if !ok {
		return objectMeta{}, p.errorf(doc, "%s: metadata is required (with a name)", kind)
	}
	var allowed []string
	if strict {
		allowed = []string{"name", "namespace", "labels"}
	}
	if err := p.mapping(metaNode, "metadata", false, allowed...); err != nil {
		return objectMeta{}, err
	}
	var meta objectMeta
	nameNode, ok := metaNode.Get("name")
	if !ok {
		return objectMeta{}, p.errorf(metaNode, "metadata.name is required")
	}
	name, err := p.scalar(nameNode, "metadata.name")
	if err != nil {
		return objectMeta{}, err
	}
	maxLength, subdomain := maxSubdomainLength, true
	if kind == kindNamespace {
		maxLength, subdomain = maxLabelLength, false
	}
	if err := validateDNSName(name, maxLength, subdomain); err != nil {
		return objectMeta{}, p.errorf(nameNode, "metadata.name: %v", err)
	}
	meta.name, meta.nameNode = name, nameNode
	if namespaced {
		meta.namespace = endpoint.DefaultNamespace
		if nsNode, ok := field(metaNode, "namespace"); ok {
			if meta.namespace, err = p.scalar(nsNode, "metadata.namespace"); err != nil {
				return objectMeta{}, err
			}
			if err := validateDNSName(meta.namespace, maxLabelLength, false); err != nil {
				return objectMeta{}, p.errorf(nsNode, "metadata.namespace: %v", err)
			}
		}
		p.current = fmt.Sprintf("%s %q", kind, meta.namespace+"/"+meta.name)
	} else {
		p.current = fmt.Sprintf("%s %q", kind, meta.name)
	}
	if labelsNode, ok := field(metaNode, "labels"); ok {
		if meta.labels, err = p.labels(labelsNode, "metadata.labels"); err != nil {
			return objectMeta{}, err
		}
	}
	if annotations, ok := field(metaNode, "annotations"); ok {
		if err := p.mapping(annotations, "metadata.annotations", false); err != nil {
			return objectMeta{}, err
		}
		meta.annotations, meta.hasAnnotations = annotations, true
	}
	return meta, nil
}

// labels reads a label map, validating keys and values as Kubernetes does.
func (p *parser) labels(n yamlread.Node, what string) (map[string]string, error) {
	if err := p.mapping(n, what, false); err != nil {
		return nil, err
	}
	labels := make(map[string]string, n.Len())
	for key, value := range n.Pairs() {
		k, err := p.str(key, what)
		if err != nil {
			return nil, err
		}
		if err := validateLabelKey(k); err != nil {
			return nil, p.errorf(key, "%s: key %v", what, err)
		}
		v, err := p.str(value, what+"."+k)
		if err != nil {
			return nil, err
		}
		if err := validateLabelValue(v); err != nil {
			return nil, p.errorf(value, "%s.%s: value %v", what, k, err)
		}
		labels[k] = v
	}
	return labels, nil
}

// nativeEndpoint parses an `ipcache-agent.io/v1 Endpoint`: strict.
func (p *parser) nativeEndpoint(n yamlread.Node) error {
	if err := p.mapping(n, kindEndpoint, false, "apiVersion", "kind", "metadata", "spec"); err != nil {
		return err
	}
	meta, err := p.metadata(n, kindEndpoint, true, true)
	if err != nil {
		return err
	}
	ep := endpoint.Endpoint{Namespace: meta.namespace, Name: meta.name, Labels: meta.labels}
	spec, ok := n.Get("spec")
	if !ok {
		return p.errorf(n, "spec is required (with addresses)")
	}
	if err := p.mapping(spec, "spec", false, "addresses", "interface", "node"); err != nil {
		return err
	}
	addrNode, ok := field(spec, "addresses")
	if !ok {
		return p.errorf(spec, "spec.addresses is required")
	}
	items, err := p.list(addrNode, "spec.addresses")
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return p.errorf(addrNode, "spec.addresses: at least one address is required")
	}
	for i, item := range items {
		addr, err := p.address(item, fmt.Sprintf("spec.addresses[%d]", i))
		if err != nil {
			return err
		}
		ep.Addresses = append(ep.Addresses, addr)
	}
	if ifNode, ok := field(spec, "interface"); ok {
		if ep.Interface, err = p.interfaceName(ifNode, "spec.interface"); err != nil {
			return err
		}
	}
	if nodeNode, ok := field(spec, "node"); ok {
		if ep.Node, err = p.nodeName(nodeNode, "spec.node"); err != nil {
			return err
		}
	}
	return p.addEndpoint(ep, meta.nameNode, items)
}

// pod parses a `v1 Pod` as kubectl prints it: the fields an endpoint
// has are read, the others skipped.
func (p *parser) pod(n yamlread.Node) error {
	meta, err := p.metadata(n, kindPod, true, false)
	if err != nil {
		return err
	}
	ep := endpoint.Endpoint{Namespace: meta.namespace, Name: meta.name, Labels: meta.labels}
	if spec, ok := field(n, "spec"); ok {
		if err := p.mapping(spec, "spec", false); err != nil {
			return err
		}
		// A pod in the host's network namespace has the node's
		// addresses: it is no endpoint, as in Cilium.
		if hostNetwork, ok := field(spec, "hostNetwork"); ok && hostNetwork.Tag() == yamlread.TagBool && isTrue(hostNetwork.Value()) {
			return nil
		}
		if nodeNode, ok := field(spec, "nodeName"); ok {
			if ep.Node, err = p.nodeName(nodeNode, "spec.nodeName"); err != nil {
				return err
			}
		}
	}
	status, ok := field(n, "status")
	if !ok {
		return p.errorf(n, "status.podIPs and status.podIP: no address (a pod that is not running yet has none)")
	}
	if err := p.mapping(status, "status", false); err != nil {
		return err
	}
	// A pod that has ended gave its addresses back: others may have them
	// now.
	if phase, ok := field(status, "phase"); ok && (phase.Value() == "Succeeded" || phase.Value() == "Failed") {
		return nil
	}
	addrNodes, places, err := p.podAddresses(status)
	if err != nil {
		return err
	}
	for i, addrNode := range addrNodes {
		addr, err := p.address(addrNode, places[i])
		if err != nil {
			return err
		}
		ep.Addresses = append(ep.Addresses, addr)
	}
	if meta.hasAnnotations {
		if ifNode, ok := field(meta.annotations, InterfaceAnnotation); ok {
			if ep.Interface, err = p.interfaceName(ifNode, "metadata.annotations."+InterfaceAnnotation); err != nil {
				return err
			}
		}
	}
	return p.addEndpoint(ep, meta.nameNode, addrNodes)
}

// podAddresses returns the nodes of a Pod's addresses, and their places
// for errors: the ip of each of status.podIPs or, when there is none,
// status.podIP.
func (p *parser) podAddresses(status yamlread.Node) (addrNodes []yamlread.Node, places []string, err error) {
	if podIPs, ok := field(status, "podIPs"); ok {
		items, err := p.list(podIPs, "status.podIPs")
		if err != nil {
			return nil, nil, err
		}
		for i, item := range items {
			what := fmt.Sprintf("status.podIPs[%d]", i)
			if err := p.mapping(item, what, false); err != nil {
				return nil, nil, err
			}
			ip, ok := item.Get("ip")
			if !ok {
				return nil, nil, p.errorf(item, "%s.ip is required", what)
			}
			addrNodes, places = append(addrNodes, ip), append(places, what+".ip")
		}
	}
	if podIP, ok := field(status, "podIP"); ok && len(addrNodes) == 0 {
		addrNodes, places = append(addrNodes, podIP), append(places, "status.podIP")
	}
	if len(addrNodes) == 0 {
		return nil, nil, p.errorf(status, "status.podIPs and status.podIP: no address (a pod that is not running yet has none)")
	}
	return addrNodes, places, nil
}

func isTrue(s string) bool { return s == "true" || s == "True" || s == "TRUE" }

// addEndpoint adds ep, unless the file already has its name or one of
// its addresses (addrNodes are the addresses' nodes, for errors).
func (p *parser) addEndpoint(ep endpoint.Endpoint, nameNode yamlread.Node, addrNodes []yamlread.Node) error {
	id := ep.ID()
	if n := len(ep.Addresses); n > endpoint.MaxAddresses {
		return p.errorf(addrNodes[endpoint.MaxAddresses], "%d addresses, at most %d", n, endpoint.MaxAddresses)
	}
	if line, dup := p.endpoints[id]; dup {
		return p.errorf(nameNode, "endpoint %q is already described at line %d", id, line)
	}
	for i, addr := range ep.Addresses {
		if j := slices.Index(ep.Addresses[:i], addr); j >= 0 {
			return p.errorf(addrNodes[i], "address %s is given twice", addr)
		}
		if use, dup := p.addresses[addr]; dup {
			return p.errorf(addrNodes[i], "address %s is already endpoint %q's, at line %d", addr, use.id, use.line)
		}
	}
	p.endpoints[id] = nameNode.Line()
	for i, addr := range ep.Addresses {
		p.addresses[addr] = addressUse{id: id, line: addrNodes[i].Line()}
	}
	p.docs.Endpoints = append(p.docs.Endpoints, ep)
	return nil
}

// namespace parses a `v1 Namespace`: its name and labels. As Kubernetes
// does, its labels always have kubernetes.io/metadata.name with its name.
func (p *parser) namespace(n yamlread.Node) error {
	meta, err := p.metadata(n, kindNamespace, false, false)
	if err != nil {
		return err
	}
	if line, dup := p.namespaces[meta.name]; dup {
		return p.errorf(meta.nameNode, "namespace %q is already described at line %d", meta.name, line)
	}
	p.namespaces[meta.name] = meta.nameNode.Line()
	if meta.labels == nil {
		meta.labels = map[string]string{}
	}
	meta.labels[endpoint.NamespaceNameLabel] = meta.name
	p.docs.Namespaces = append(p.docs.Namespaces, endpoint.Namespace{Name: meta.name, Labels: meta.labels})
	return nil
}

// node parses a `v1 Node`: its name and the addresses of its
// status.addresses that are IP addresses (InternalIP, ExternalIP); the
// others (Hostname, InternalDNS, ...) are skipped.
func (p *parser) node(n yamlread.Node) error {
	meta, err := p.metadata(n, kindNode, false, false)
	if err != nil {
		return err
	}
	if line, dup := p.nodes[meta.name]; dup {
		return p.errorf(meta.nameNode, "node %q is already described at line %d", meta.name, line)
	}
	node := endpoint.Node{Name: meta.name}
	if status, ok := field(n, "status"); ok {
		if err := p.mapping(status, "status", false); err != nil {
			return err
		}
		if addrNode, ok := field(status, "addresses"); ok {
			items, err := p.list(addrNode, "status.addresses")
			if err != nil {
				return err
			}
			for i, item := range items {
				what := fmt.Sprintf("status.addresses[%d]", i)
				if err := p.mapping(item, what, false); err != nil {
					return err
				}
				typ, ok := item.Get("type")
				if !ok || typ.Value() != "InternalIP" && typ.Value() != "ExternalIP" {
					continue
				}
				value, ok := item.Get("address")
				if !ok {
					return p.errorf(item, "%s.address is required", what)
				}
				addr, err := p.address(value, what+".address")
				if err != nil {
					return err
				}
				node.Addresses = append(node.Addresses, addr)
			}
		}
	}
	if len(node.Addresses) > 0 {
		node.Addresses = endpoint.SortedAddresses(node.Addresses)
	}
	p.nodes[meta.name] = meta.nameNode.Line()
	p.docs.Nodes = append(p.docs.Nodes, node)
	return nil
}

// address parses an endpoint's or a node's address.
func (p *parser) address(n yamlread.Node, what string) (netip.Addr, error) {
	s, err := p.scalar(n, what)
	if err != nil {
		return netip.Addr{}, err
	}
	addr, err := parseAddress(s)
	if err != nil {
		return netip.Addr{}, p.errorf(n, "%s: %v", what, err)
	}
	return addr, nil
}

// interfaceName parses the name of a device.
func (p *parser) interfaceName(n yamlread.Node, what string) (string, error) {
	s, err := p.scalar(n, what)
	if err != nil {
		return "", err
	}
	if err := validateInterface(s); err != nil {
		return "", p.errorf(n, "%s: %v", what, err)
	}
	return s, nil
}

// nodeName parses the name of a node.
func (p *parser) nodeName(n yamlread.Node, what string) (string, error) {
	s, err := p.scalar(n, what)
	if err != nil {
		return "", err
	}
	if err := validateDNSName(s, maxSubdomainLength, true); err != nil {
		return "", p.errorf(n, "%s: %v", what, err)
	}
	return s, nil
}
