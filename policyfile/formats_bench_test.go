// SPDX-License-Identifier: Apache-2.0

package policyfile

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// formatFiles returns n policy files, one policy each, in the native
// format and in a Kubernetes format (CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy, NetworkPolicy and a List, in turn),
// file i of both with the same rules: an egress rule of 10 CIDRs to
// 443/TCP and an ingress rule of a CIDR with an except from 53/UDP.
func formatFiles(n int) (native, mixed [][]byte) {
	for i := range n {
		var cidrs []string
		for j := range 10 {
			k := i*10 + j
			cidrs = append(cidrs, fmt.Sprintf("10.%d.%d.0/24", k>>8&0xff, k&0xff))
		}
		list := strings.Join(cidrs, ", ")
		from := fmt.Sprintf("172.%d.0.0/16", 16+i%16)
		except := fmt.Sprintf("172.%d.1.0/24", 16+i%16)
		native = append(native, fmt.Appendf(nil, `name: p%d
egress:
  - toCIDR: [%s]
    toPorts: [{port: 443, protocol: TCP}]
ingress:
  - fromCIDRSet: [{cidr: %s, except: [%s]}]
    toPorts: [{port: 53, protocol: UDP}]
`, i, list, from, except))
		cilium := fmt.Sprintf(`spec:
  endpointSelector: {}
  egress:
    - toCIDR: [%s]
      toPorts: [{ports: [{port: "443", protocol: TCP}]}]
  ingress:
    - fromCIDRSet: [{cidr: %s, except: [%s]}]
      toPorts: [{ports: [{port: "53", protocol: UDP}]}]
`, list, from, except)
		var doc string
		switch i % 4 {
		case 0:
			doc = fmt.Sprintf("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p%d, namespace: shop}\n%s", i, cilium)
		case 1:
			doc = fmt.Sprintf("apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: p%d}\n%s", i, cilium)
		case 2:
			var blocks []string
			for _, cidr := range cidrs {
				blocks = append(blocks, "{ipBlock: {cidr: "+cidr+"}}")
			}
			doc = fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p%d, namespace: shop}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  egress:
    - to: [%s]
      ports: [{port: 443}]
  ingress:
    - from: [{ipBlock: {cidr: %s, except: [%s]}}]
      ports: [{port: 53, protocol: UDP}]
`, i, strings.Join(blocks, ", "), from, except)
		case 3:
			indented := strings.ReplaceAll(strings.TrimSuffix(cilium, "\n"), "\n", "\n    ")
			doc = fmt.Sprintf("apiVersion: v1\nkind: List\nitems:\n  - apiVersion: cilium.io/v2\n    kind: CiliumNetworkPolicy\n    metadata: {name: p%d}\n    %s\n", i, indented)
		}
		mixed = append(mixed, []byte(doc))
	}
	return native, mixed
}

// BenchmarkParseFormats parses 1,000 files of each: native ones, and
// ones of the Kubernetes kinds in turn with the same rules (checked
// before timing). Compare native and mixed of the same run.
func BenchmarkParseFormats(b *testing.B) {
	const files = 1_000
	native, mixed := formatFiles(files)
	for i := range files {
		n, err := Parse("n.yaml", native[i])
		require.NoError(b, err)
		m, err := Parse("m.yaml", mixed[i])
		require.NoError(b, err, "%s", mixed[i])
		require.Equal(b, rulesOnly(n), rulesOnly(m), "file %d", i)
	}
	for _, bc := range []struct {
		name  string
		files [][]byte
	}{{"native", native}, {"mixed", mixed}} {
		b.Run(bc.name, func(b *testing.B) {
			bytes := 0
			for _, content := range bc.files {
				bytes += len(content)
			}
			b.SetBytes(int64(bytes))
			b.ReportAllocs()
			for b.Loop() {
				for _, content := range bc.files {
					if _, err := Parse("f.yaml", content); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
