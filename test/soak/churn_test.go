// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// Bounds of the live state, so that the agent's state (and the maps that
// grow to their peak and never shrink) reaches its steady size in the
// warm-up already.
const (
	numFiles          = 16  // policy files f00.yaml .. f15.yaml
	maxOwnerPrefixes  = 400 // prefixes one ipcache owner holds at most
	maxUpsertBatch    = 150
	sharedPoolSize    = 48 // prefixes that files and owners share
	invalidFileChance = 30 // 1 in N file writes is an invalid file
)

// owners are the ipcache resource handles the churn holds besides the
// policies, each with its own source so that precedence decides merges.
var owners = []struct {
	resource string
	source   source.Source
}{
	{"soak/pods", source.Kubernetes},
	{"soak/local", source.Local},
	{"soak/kvstore", source.KVStore},
	{"soak/generated", source.Generated},
}

// ownerLabels are the labels owners add to prefixes; an owner adding one
// to a prefix a policy holds changes the prefix's identity.
var ownerLabels = []string{"app:a", "app:b", "team:x"}

// churn makes random changes to the policy directory and through ipcache
// handles, and keeps the model of what the agent must converge to.
type churn struct {
	t   *testing.T
	rng *rand.Rand
	a   *agent

	shared []netip.Prefix

	files  map[string]*policyFile // on disk, by name
	owners []*owner

	ops      map[string]int // operations performed, by kind
	upserted int            // prefixes written (files and owners)
}

type policyFile struct {
	content []byte
	// policies is the parsed content; nil with valid false for a file
	// written invalid on purpose (the agent keeps some earlier version).
	policies []*policy.Policy
	valid    bool
}

type owner struct {
	resource string
	source   source.Source
	handle   *ipcachecell.Handle // nil while released
	said     map[netip.Prefix]ipcachecell.Metadata
}

func newChurn(t *testing.T, a *agent, seed uint64) *churn {
	c := &churn{
		t:     t,
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		a:     a,
		files: map[string]*policyFile{},
		ops:   map[string]int{},
	}
	for range sharedPoolSize {
		c.shared = append(c.shared, c.randomPrefix())
	}
	for _, o := range owners {
		c.owners = append(c.owners, &owner{resource: o.resource, source: o.source, said: map[netip.Prefix]ipcachecell.Metadata{}})
	}
	return c
}

// randomPrefix returns an IPv4 prefix in 10.0.0.0/14 or an IPv6 prefix in
// 2001:db8::/46, of a length that makes nesting likely (a /16 holds /24s
// that hold /32s).
func (c *churn) randomPrefix() netip.Prefix {
	if c.rng.IntN(5) < 3 {
		addr := netip.AddrFrom4([4]byte{10, byte(c.rng.IntN(4)), byte(c.rng.IntN(256)), byte(c.rng.IntN(256))})
		bits := []int{8, 12, 16, 20, 24, 24, 26, 28, 30, 32, 32, 32}[c.rng.IntN(12)]
		return netip.PrefixFrom(addr, bits).Masked()
	}
	var a [16]byte
	copy(a[:], []byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(c.rng.IntN(4)), 0, byte(c.rng.IntN(256))})
	for i := 8; i < 16; i++ {
		a[i] = byte(c.rng.IntN(256))
	}
	bits := []int{32, 40, 48, 56, 64, 64, 96, 112, 120, 128, 128, 128}[c.rng.IntN(12)]
	return netip.PrefixFrom(netip.AddrFrom16(a), bits).Masked()
}

// prefix returns a shared prefix or a fresh random one.
func (c *churn) prefix() netip.Prefix {
	if c.rng.IntN(5) < 2 {
		return c.shared[c.rng.IntN(len(c.shared))]
	}
	return c.randomPrefix()
}

// narrower returns a random prefix strictly inside p (for an except).
func (c *churn) narrower(p netip.Prefix) (netip.Prefix, bool) {
	maxBits := p.Addr().BitLen()
	if p.Bits() >= maxBits {
		return netip.Prefix{}, false
	}
	bits := p.Bits() + 1 + c.rng.IntN(min(16, maxBits-p.Bits()))
	raw := p.Addr().AsSlice()
	for i := p.Bits(); i < maxBits; i++ {
		if c.rng.IntN(2) == 0 {
			raw[i/8] |= 1 << (7 - i%8)
		}
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.PrefixFrom(addr, bits).Masked(), true
}

// step performs one random operation.
func (c *churn) step() {
	switch r := c.rng.IntN(100); {
	case r < 30:
		c.writeFile(fmt.Sprintf("f%02d.yaml", c.rng.IntN(numFiles)))
	case r < 36:
		c.removeFile()
	case r < 70:
		c.upsert(c.owners[c.rng.IntN(len(c.owners))])
	case r < 96:
		c.remove(c.owners[c.rng.IntN(len(c.owners))])
	default:
		c.release(c.owners[c.rng.IntN(len(c.owners))])
	}
}

// policyContent returns a valid policy file of 1 to 3 policies named
// after the file (so that names never collide across files).
func (c *churn) policyContent(file string) []byte {
	var b strings.Builder
	base := strings.TrimSuffix(file, ".yaml")
	list := func(n int) string {
		var items []string
		for range n {
			p := c.prefix()
			if c.rng.IntN(60) == 0 {
				p = netip.MustParsePrefix([]string{"0.0.0.0/0", "::/0"}[c.rng.IntN(2)])
			}
			items = append(items, `"`+p.String()+`"`)
		}
		return strings.Join(items, ", ")
	}
	for i := range 1 + c.rng.IntN(3) {
		if i > 0 {
			b.WriteString("---\n")
		}
		fmt.Fprintf(&b, "name: %s-p%d\n", base, i)
		for _, dir := range []string{"egress", "ingress"} {
			if c.rng.IntN(3) == 0 {
				continue
			}
			peer := map[string]string{"egress": "to", "ingress": "from"}[dir]
			fmt.Fprintf(&b, "%s:\n", dir)
			for range 1 + c.rng.IntN(3) {
				if c.rng.IntN(3) == 0 {
					fmt.Fprintf(&b, "  - %sCIDRSet:\n", peer)
					for range 1 + c.rng.IntN(2) {
						cidr := c.prefix()
						fmt.Fprintf(&b, "      - cidr: %s\n", cidr)
						var excepts []string
						for range c.rng.IntN(3) {
							if e, ok := c.narrower(cidr); ok {
								excepts = append(excepts, `"`+e.String()+`"`)
							}
						}
						if len(excepts) > 0 {
							fmt.Fprintf(&b, "        except: [%s]\n", strings.Join(excepts, ", "))
						}
					}
				} else {
					fmt.Fprintf(&b, "  - %sCIDR: [%s]\n", peer, list(1+c.rng.IntN(8)))
				}
				switch c.rng.IntN(4) {
				case 0:
					fmt.Fprintf(&b, "    toPorts: [{port: %d, protocol: UDP}, {port: 443, protocol: TCP}]\n", 53+c.rng.IntN(2))
				case 1:
					fmt.Fprintf(&b, "    toPorts: [{port: %d}]\n", 8000+c.rng.IntN(4))
				}
			}
		}
	}
	return []byte(b.String())
}

// invalidContent returns a file the agent must reject as a whole.
func (c *churn) invalidContent(file string) []byte {
	base := strings.TrimSuffix(file, ".yaml")
	valid := c.policyContent(file)
	switch c.rng.IntN(4) {
	case 0: // a CIDR that does not parse, after valid documents
		return fmt.Appendf(valid, "---\nname: %s-bad\negress:\n  - toCIDR: [\"10.0.0.300/8\"]\n", base)
	case 1: // YAML syntax
		return fmt.Appendf(valid, "---\nname: %s-bad\negress: [\n", base)
	case 2: // an unknown field
		return fmt.Appendf(nil, "name: %s-p0\negress:\n  - toFQDN: [\"example.com\"]\n", base)
	default: // a name repeated in the file
		return fmt.Appendf(valid, "---\nname: %s-p0\n", base)
	}
}

// writeFile writes, or rewrites, a policy file: mostly atomically (write
// beside, rename, as a ConfigMap update), sometimes in place (the agent
// may read it half written, reject or take the half, and must take the
// whole on the next event).
func (c *churn) writeFile(name string) {
	f := &policyFile{valid: true}
	if c.rng.IntN(invalidFileChance) == 0 {
		f.content, f.valid = c.invalidContent(name), false
		c.ops["file-write-invalid"]++
	} else {
		f.content = c.policyContent(name)
		var err error
		f.policies, err = policyfile.Parse(name, f.content)
		require.NoError(c.t, err, "the generator wrote an invalid file:\n%s", f.content)
		for _, p := range f.policies {
			c.upserted += len(p.Prefixes())
		}
		if _, exists := c.files[name]; exists {
			c.ops["file-rewrite"]++
		} else {
			c.ops["file-write"]++
		}
	}
	path := filepath.Join(c.a.PolicyDir, name)
	if c.rng.IntN(5) == 0 {
		require.NoError(c.t, os.WriteFile(path, f.content, 0o600))
	} else {
		tmp := filepath.Join(c.a.PolicyDir, ".tmp-"+name)
		require.NoError(c.t, os.WriteFile(tmp, f.content, 0o600))
		require.NoError(c.t, os.Rename(tmp, path))
	}
	c.files[name] = f
}

func (c *churn) removeFile() {
	if len(c.files) == 0 {
		return
	}
	names := slices.Sorted(maps.Keys(c.files))
	name := names[c.rng.IntN(len(names))]
	require.NoError(c.t, os.Remove(filepath.Join(c.a.PolicyDir, name)))
	delete(c.files, name)
	c.ops["file-remove"]++
}

// fixInvalidFiles rewrites every file written invalid with valid content,
// so that what the agent has in force is known again.
func (c *churn) fixInvalidFiles() {
	for _, name := range slices.Sorted(maps.Keys(c.files)) {
		if !c.files[name].valid {
			c.writeFile(name)
			for !c.files[name].valid {
				c.writeFile(name)
			}
		}
	}
}

func (c *churn) handle(o *owner) *ipcachecell.Handle {
	if o.handle == nil {
		h, err := c.a.ipcache.NewHandle(o.resource, o.source)
		require.NoError(c.t, err)
		o.handle = h
	}
	return o.handle
}

func (c *churn) randomMetadata() ipcachecell.Metadata {
	var md ipcachecell.Metadata
	var ls []string
	for _, l := range ownerLabels {
		if c.rng.IntN(4) == 0 {
			ls = append(ls, l)
		}
	}
	var err error
	md.Labels, err = labels.New(ls...)
	require.NoError(c.t, err)
	switch c.rng.IntN(20) {
	case 0:
		md.RequestedIdentity = identity.MinLocal + identity.Number(c.rng.IntN(5000))
	case 1:
		// An identity allocated elsewhere (an embedding agent's pod
		// identity): not reference counted here, never selected.
		md.ExplicitIdentity = identity.Number(1000 + c.rng.IntN(4))
	}
	return md
}

func (c *churn) upsert(o *owner) {
	if len(o.said) >= maxOwnerPrefixes {
		c.remove(o)
		return
	}
	var batch []ipcachecell.PrefixUpsert
	for range 1 + c.rng.IntN(maxUpsertBatch) {
		p := c.prefix()
		md := c.randomMetadata()
		batch = append(batch, ipcachecell.PrefixUpsert{Prefix: p, Metadata: md})
	}
	require.NoError(c.t, c.handle(o).UpsertBatch(batch))
	for _, u := range batch {
		o.said[u.Prefix] = u.Metadata // the last upsert of a prefix wins
	}
	c.upserted += len(batch)
	c.ops["owner-upsert"]++
}

func (c *churn) remove(o *owner) {
	if len(o.said) == 0 {
		return
	}
	var gone []netip.Prefix
	for _, p := range slices.SortedFunc(maps.Keys(o.said), prefixkey.Compare) {
		if c.rng.IntN(3) == 0 {
			gone = append(gone, p)
		}
	}
	require.NoError(c.t, c.handle(o).RemoveBatch(gone))
	for _, p := range gone {
		delete(o.said, p)
	}
	c.ops["owner-remove"]++
}

func (c *churn) release(o *owner) {
	if o.handle == nil {
		return
	}
	require.NoError(c.t, o.handle.Release())
	o.handle = nil
	clear(o.said)
	c.ops["owner-release"]++
}

// removeAll removes every policy file and releases every handle.
func (c *churn) removeAll() {
	for name := range c.files {
		require.NoError(c.t, os.Remove(filepath.Join(c.a.PolicyDir, name)))
		delete(c.files, name)
	}
	for _, o := range c.owners {
		if o.handle != nil {
			require.NoError(c.t, o.handle.Release())
			o.handle = nil
		}
		clear(o.said)
	}
}

func (c *churn) totalOps() int {
	n := 0
	for _, k := range c.ops {
		n += k
	}
	return n
}
