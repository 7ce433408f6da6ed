// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse: the parser never panics; an error is a *FileError naming the
// file and wrapping ErrInvalidFile; what a file gives is valid on its own
// (every endpoint has a valid name and at least one address, no two
// endpoints share a name or an address, labels are valid).
func FuzzParse(f *testing.F) {
	for _, name := range []string{"pods.yaml", "cluster.yaml"} {
		content, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(content)
	}
	f.Add([]byte(epHead + "metadata: {name: web-1, namespace: shop, labels: {app: web}}\nspec: {addresses: [10.0.1.5, \"fd00::5\"], interface: veth0, node: n}\n"))
	f.Add([]byte(podHead + "metadata: {name: a}\nstatus: {podIPs: [{ip: 10.0.0.1}], podIP: 10.0.0.1}\n---\n" + podHead + "metadata: {name: b}\nstatus: {podIP: 10.0.0.1}\n"))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Namespace, metadata: {name: a, labels: {a/b: c}}}]\n"))
	f.Add([]byte("apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: \"::ffff:1.2.3.4\"}]}\n"))
	f.Add([]byte("a: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := Parse("fuzz.yaml", data)
		if err != nil {
			var ferr *FileError
			if !errors.As(err, &ferr) || ferr.File != "fuzz.yaml" || !errors.Is(err, ErrInvalidFile) ||
				!strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error is not a *FileError of fuzz.yaml wrapping ErrInvalidFile: %v", err)
			}
			return
		}
		ids := map[string]bool{}
		addrs := map[netip.Addr]bool{}
		for _, ep := range docs.Endpoints {
			if validateDNSName(ep.Name, maxSubdomainLength, true) != nil || validateDNSName(ep.Namespace, maxLabelLength, false) != nil {
				t.Fatalf("endpoint %q: invalid name", ep.ID())
			}
			if ids[ep.ID()] {
				t.Fatalf("endpoint %q given twice", ep.ID())
			}
			ids[ep.ID()] = true
			if len(ep.Addresses) == 0 {
				t.Fatalf("endpoint %q without address", ep.ID())
			}
			for _, a := range ep.Addresses {
				if !a.IsValid() || a.Is4In6() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || addrs[a] {
					t.Fatalf("endpoint %q: bad or repeated address %v", ep.ID(), a)
				}
				addrs[a] = true
			}
			for k, v := range ep.Labels {
				if validateLabelKey(k) != nil || validateLabelValue(v) != nil {
					t.Fatalf("endpoint %q: invalid label %q=%q", ep.ID(), k, v)
				}
			}
			if ep.Interface != "" && validateInterface(ep.Interface) != nil {
				t.Fatalf("endpoint %q: invalid interface %q", ep.ID(), ep.Interface)
			}
		}
		for _, ns := range docs.Namespaces {
			if ns.Labels["kubernetes.io/metadata.name"] != ns.Name {
				t.Fatalf("namespace %q without its name label", ns.Name)
			}
		}
	})
}
