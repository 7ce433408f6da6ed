// SPDX-License-Identifier: Apache-2.0

// TestLayers keeps docs/ARCHITECTURE.md's picture of the module true by
// construction: the picture is the table below, and the test fails when an
// import does not fit it. The module is in layers, each package in one:
//
//	0 vocabulary      identity numbers, labels, sources, state files, metrics, small helpers
//	1 policy          the policy vocabulary (over identity numbers)
//	2 formats, ABI    policy files (policyfile), the pinned maps (bpfmaps)
//	3 events          the program's events
//	3-5 cells         one hive cell each, above the cells whose tables they read
//	6 composition     the cells put together (cells), embedding examples' cells
//	7 command library agentcmd
//	8 commands        the binaries, examples, tools, test-only packages
//
// and the rules are:
//
//   - a package imports module packages only from strictly lower layers,
//     or from its own layer if the pair is in allowedSameLayer with a
//     reason;
//   - a cell (kind "cell", its directory ends with "cell") imports no other
//     cell unless the pair is in allowedCellImports with a reason: cells
//     reach each other through statedb tables or interfaces provided in
//     the hive, which is what lets an embedding agent replace one; an
//     allowed import is one for a table's row type or a handle of the
//     cell that owns the table;
//   - only test packages import test harnesses;
//   - every module package is in the table, and the table lists no
//     package that is gone: a new package is placed on purpose, in the
//     table and in docs/ARCHITECTURE.md.
//
// knownViolations holds violations the tree has and the design does not
// allow: the test tolerates and logs them, and fails when one of them no
// longer occurs, so the list can only shrink. It is empty: the first run
// found 23 (docs/ARCHITECTURE.md, "Packages by layer").
package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The kinds of package in the layers table.
const (
	kindLeaf        = "leaf"        // vocabulary that every layer above may use
	kindCell        = "cell"        // one hive cell
	kindComposition = "composition" // cells put together
	kindCommand     = "command"     // a command line or a tool
	kindInternal    = "internal"    // a cell's internal package
	kindExample     = "example"     // how an embedding agent uses the cells
	kindTest        = "test"        // test harnesses and test-only packages
)

// place is a package's layer and kind.
type place struct {
	layer int
	kind  string
}

// layers is the table of every module package (its import path relative
// to the module) and its place. Keep it and docs/ARCHITECTURE.md in step.
func layers() map[string]place {
	return map[string]place{
		// 0: vocabulary, and internal packages that import nothing of ours.
		"identity":             {0, kindLeaf},
		"labels":               {0, kindLeaf},
		"fqdn":                 {0, kindLeaf},
		"source":               {0, kindLeaf},
		"statedir":             {0, kindLeaf},
		"metrics":              {0, kindLeaf},
		"internal/atomicfile":  {0, kindLeaf},
		"internal/prefixkey":   {0, kindLeaf},
		"internal/netnsrun":    {0, kindLeaf},
		"internal/progress":    {0, kindLeaf},
		"internal/resubscribe": {0, kindLeaf},
		"internal/scriptcmd":   {0, kindLeaf},
		"internal/yamlread":    {0, kindLeaf},
		"agentcmd/stopsignal":  {0, kindLeaf},
		"datapathcell/bpf":     {0, kindInternal},
		"dnsproxy":             {0, kindLeaf},
		"dnsproxy/bpf":         {0, kindInternal},

		// 1: the policy vocabulary.
		"policy":   {1, kindLeaf},
		"endpoint": {1, kindLeaf},

		// 2: the policy file formats and the pinned maps' ABI.
		"policyfile":   {2, kindLeaf},
		"endpointfile": {2, kindLeaf},

		// 2: a watched directory of YAML files (for the policy and endpoint
		// directories).
		"internal/yamldir": {2, kindLeaf},
		"bpfmaps":          {2, kindLeaf},

		// 2: the endpoint socket's protocol (the CNI plugin and the agent).
		"endpointapi": {2, kindLeaf},

		// 3: the program's events (over the maps' reason codes).
		"events": {3, kindLeaf},

		// 3: the datapath's map writes (over the maps' ABI).
		"datapathcell/internal/mapwrite": {3, kindInternal},

		// 3-5: cells, each above the cells whose tables it reads.
		"identitycell":  {3, kindCell},
		"devicecell":    {3, kindCell},
		"ipcachecell":   {4, kindCell},
		"policycell":    {5, kindCell},
		"datapathcell":  {5, kindCell},
		"restorecell":   {5, kindCell},
		"fqdncell":      {5, kindCell},
		"endpointcell":  {5, kindCell},
		"nodecell":      {5, kindCell},
		"metricscell":   {5, kindCell},
		"monitorcell":   {5, kindCell},
		"conntrackcell": {5, kindCell},
		"cnicell":       {5, kindCell},

		// 6: composition.
		"cells":                  {6, kindComposition},
		"examples/embed/podcell": {6, kindExample},

		// 7: the command line, shared with embedding agents.
		"agentcmd": {7, kindCommand},

		// 8: commands, examples, tools and tests.
		"cmd/ipcache-agent":       {8, kindCommand},
		"cmd/bench-scale":         {8, kindCommand},
		"cmd/bench-peer":          {8, kindCommand},
		"cmd/ipcache-agent-cni":   {8, kindCommand},
		"examples/embed":          {8, kindExample},
		"internal/tools/exported": {8, kindCommand},
		"internal/archtest":       {8, kindTest},
		"test/soak":               {8, kindTest},
		"test/corpus":             {8, kindTest},
		"test/netpol":             {8, kindTest},

		// Test harnesses, each above what it builds on.
		"internal/testutils/privileged":  {0, kindTest},
		"internal/testutils/syncbuf":     {0, kindTest},
		"internal/testutils/jsoncmd":     {0, kindTest},
		"internal/testutils/netnstest":   {0, kindTest},
		"internal/testutils/policygen":   {2, kindTest},
		"internal/testutils/craft":       {1, kindTest},
		"internal/testutils/ipcachetest": {5, kindTest},
		"internal/testutils/agenttest":   {6, kindTest},

		// The endpoint registry of the endpoint sources' tests; a real CNI
		// chain (cnitool, ptp, the plugin).
		"internal/testutils/registrytest": {2, kindTest},
		"internal/testutils/cnitest":      {0, kindTest},
		"internal/testutils/parallel":     {0, kindTest},
	}
}

// edge is an import: pkg imports dep (both relative to the module).
type edge struct{ pkg, dep string }

func (e edge) String() string { return e.pkg + " imports " + e.dep }

// allowedSameLayer lists the imports within one layer that the design
// allows, each with the reason why.
func allowedSameLayer() map[edge]string {
	return map[edge]string{
		{"endpointcell", "nodecell"}:                          "hands the Node documents of the endpoint directory to the node cell's Nodes",
		{"internal/testutils/netnstest", "internal/netnsrun"}: "the tests' harness enters namespaces as cmd/bench-peer does, through the one function that does it",
		{"labels", "internal/prefixkey"}:                      "a CIDR identity's label set holds its prefix's key, the bytes the identities' labels index keys it by",
	}
}

// allowedCellImports lists the cells that may import another cell, each
// with a one-line reason why a table or an interface would not do.
func allowedCellImports() map[edge]string {
	return map[edge]string{
		{"ipcachecell", "identitycell"}:  "allocates and releases identities through the allocator, in the `identities` table's transactions",
		{"policycell", "identitycell"}:   "reads the `identities` table (the selectors)",
		{"policycell", "ipcachecell"}:    "owns a resource handle per policy; reads the `ipcache` table (explain)",
		{"monitorcell", "identitycell"}:  "reads the `identities` table for the labels of an event's identity",
		{"datapathcell", "ipcachecell"}:  "writes the `ipcache` table's entries into the map",
		{"restorecell", "identitycell"}:  "withholds and returns numbers through the allocator; reads the checkpoint",
		{"restorecell", "ipcachecell"}:   "owns the restore resource handle",
		{"endpointcell", "identitycell"}: "takes and releases each endpoint's label identity reference through the allocator, in the `endpoints` table's transactions",
		{"endpointcell", "ipcachecell"}:  "owns a resource handle per endpoint source",
		{"nodecell", "ipcachecell"}:      "owns the host and remote-node resource handles",
		{"fqdncell", "ipcachecell"}:      "owns the fqdn resource handle (shared identities); reads the `ipcache` and `ipcache-metadata` tables (identities, covering prefixes)",
		{"endpointcell", "nodecell"}:     "hands the Node documents of the endpoint directory to the Nodes handle",
		{"datapathcell", "devicecell"}:   "attaches the program to the `devices` table's devices (its row type)",
	}
}

// knownViolations are violations the tree has and the design does not
// allow (see the top of the file): tolerated, logged, and to be removed
// from here when they are fixed (the test fails until they are).
func knownViolations() []edge {
	return []edge{}
}

func TestLayers(t *testing.T) {
	root := moduleRoot(t)
	pkgs := listPackages(t, root)
	table := layers()
	sameLayer := allowedSameLayer()
	cellImports := allowedCellImports()

	checkTable(t, table, pkgs)

	found := map[edge]string{} // violation: its message
	usedSameLayer := map[edge]bool{}
	usedCellImports := map[edge]bool{}
	for _, pkg := range sortedKeys(pkgs) {
		from, ok := table[pkg]
		if !ok {
			continue // reported by checkTable
		}
		for _, dep := range pkgs[pkg] {
			to, ok := table[dep]
			if !ok {
				continue // reported by checkTable
			}
			e := edge{pkg, dep}
			var reasons []string
			switch {
			case to.layer > from.layer:
				reasons = append(reasons, "a higher layer")
			case to.layer == from.layer:
				if _, ok := sameLayer[e]; ok {
					usedSameLayer[e] = true
				} else {
					reasons = append(reasons, "the same layer, not in allowedSameLayer")
				}
			}
			if to.kind == kindTest && from.kind != kindTest {
				reasons = append(reasons, "a test harness imported by a package that is no test")
			}
			if from.kind == kindCell && to.kind == kindCell {
				if _, ok := cellImports[e]; ok {
					usedCellImports[e] = true
				} else {
					reasons = append(reasons, "a cell importing a cell, not in allowedCellImports")
				}
			}
			if len(reasons) > 0 {
				found[e] = fmt.Sprintf("%s (layer %d) imports %s (layer %d): %s",
					pkg, from.layer, dep, to.layer, strings.Join(reasons, "; "))
			}
		}
	}

	// Allow-list entries that nothing needs any more go, so that the lists
	// say what the tree needs and not what it once did.
	for _, e := range sortedEdges(sameLayer) {
		if !usedSameLayer[e] {
			t.Errorf("allowedSameLayer lists %s, which is no import within one layer: remove it", e)
		}
	}
	for _, e := range sortedEdges(cellImports) {
		if !usedCellImports[e] {
			t.Errorf("allowedCellImports lists %s, which is no import of a cell by a cell: remove it", e)
		}
	}

	known := map[edge]bool{}
	for _, e := range knownViolations() {
		if known[e] {
			t.Errorf("knownViolations lists %s twice", e)
		}
		known[e] = true
		if msg, ok := found[e]; ok {
			t.Logf("known violation (fix it, then remove it from knownViolations): %s", msg)
		} else {
			t.Errorf("knownViolations lists %s, which is no violation any more: remove it from the list", e)
		}
	}

	var violations []string
	for _, e := range sortedEdges(found) {
		if !known[e] {
			violations = append(violations, found[e])
		}
	}
	if len(violations) > 0 {
		t.Errorf("imports that break the layers of docs/ARCHITECTURE.md (move the code, reach the other cell "+
			"through a table or an interface, or change the design in the table here and in the doc):\n\t%s",
			strings.Join(violations, "\n\t"))
	}
}

// checkTable fails for module packages that the table does not place, for
// table entries that are no package, and for kinds that do not fit.
func checkTable(t *testing.T, table map[string]place, pkgs map[string][]string) {
	t.Helper()
	var missing []string
	for _, pkg := range sortedKeys(pkgs) {
		if _, ok := table[pkg]; !ok {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		t.Errorf("packages without a layer: %s\n"+
			"add each to the layers table in internal/archtest/layers_test.go and to docs/ARCHITECTURE.md",
			strings.Join(missing, ", "))
	}
	for _, pkg := range sortedKeys(table) {
		p := table[pkg]
		if _, ok := pkgs[pkg]; !ok {
			t.Errorf("the layers table lists %s, which is no package of the module: "+
				"remove it from the table and from docs/ARCHITECTURE.md", pkg)
		}
		switch p.kind {
		case kindLeaf, kindCell, kindComposition, kindCommand, kindInternal, kindExample, kindTest:
		default:
			t.Errorf("the layers table gives %s the unknown kind %q", pkg, p.kind)
		}
		// The cell rule goes by kind; the name keeps the kind honest.
		isCellName := strings.HasSuffix(path.Base(pkg), "cell")
		if p.kind == kindCell && !isCellName {
			t.Errorf("the layers table makes %s a cell, but a cell's directory ends with \"cell\"", pkg)
		}
		if isCellName && p.kind != kindCell && p.kind != kindExample {
			t.Errorf("the layers table makes %s a %s, but its directory ends with \"cell\": make it a cell", pkg, p.kind)
		}
	}
}

// moduleRoot is the directory of the module's go.mod, as the go command
// finds it from the test's working directory (the package's directory).
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", commandError(err))
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" || filepath.Base(gomod) != "go.mod" {
		t.Fatalf("go env GOMOD is %q: the test must run inside the module", gomod)
	}
	return filepath.Dir(gomod)
}

// listPackages runs go list on the whole module and returns each package's
// non-test imports of module packages, all paths relative to the module.
// The imports are those of the host's GOOS and GOARCH, as go list gives.
func listPackages(t *testing.T, root string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -json ./... in %s: %v", root, commandError(err))
	}

	type listed struct {
		ImportPath string
		Imports    []string // not TestImports or XTestImports: tests may reach further
		Module     *struct{ Path string }
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list -json: %v", err)
		}
		if p.Module == nil {
			t.Fatalf("go list gives %s no module", p.ImportPath)
		}
		rel, ok := relative(p.Module.Path, p.ImportPath)
		if !ok {
			t.Fatalf("go list gives %s, which is not in module %s", p.ImportPath, p.Module.Path)
		}
		var deps []string
		for _, imp := range p.Imports {
			if dep, ok := relative(p.Module.Path, imp); ok {
				deps = append(deps, dep)
			}
		}
		pkgs[rel] = deps
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list -json ./... in %s listed no package", root)
	}
	return pkgs
}

// relative is importPath relative to module ("." for the module's own
// root package); ok is false for a package outside the module.
func relative(module, importPath string) (string, bool) {
	if importPath == module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(importPath, module+"/")
	return rel, ok
}

// commandError adds a failed command's stderr to its error.
func commandError(err error) error {
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && len(exitErr.Stderr) > 0 {
		return fmt.Errorf("%w\n%s", err, exitErr.Stderr)
	}
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedEdges[V any](m map[edge]V) []edge {
	edges := make([]edge, 0, len(m))
	for e := range m {
		edges = append(edges, e)
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].pkg != edges[j].pkg {
			return edges[i].pkg < edges[j].pkg
		}
		return edges[i].dep < edges[j].dep
	})
	return edges
}
