// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/examples/embed/podcell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// The tests in this file hold README.md to the code, so that what an
// embedder reads stays true: the cells the control plane composes, the
// tables and their columns, the flags and their defaults, the Go names it
// mentions, the pods file's example and error, the source precedence and
// the script tests. Each fails naming the README's claim and the code's
// fact when the two drift apart; the README says these facts in forms
// the tests parse (a numbered list, a table, backquoted names).

// readme returns README.md. A claim may be broken over lines: the tests
// compare words, not white space.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	return string(b)
}

// section returns the part of text from the heading line that starts
// with heading up to the next heading of the same or a higher level (a
// "#" line in a code block is no heading).
func section(t *testing.T, text, heading string) string {
	t.Helper()
	start := strings.Index(text, "\n"+heading)
	require.GreaterOrEqual(t, start, 0, "README.md has no heading %q", heading)
	level := strings.IndexFunc(heading, func(r rune) bool { return r != '#' })
	rest := text[start+1:]
	offset, fenced := 0, false
	for i, line := range strings.SplitAfter(rest, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		n := strings.IndexFunc(line, func(r rune) bool { return r != '#' })
		if i > 0 && !fenced && n > 0 && n <= level && strings.HasPrefix(line[n:], " ") {
			return rest[:offset]
		}
		offset += len(line)
	}
	return rest
}

// topLevel is a cell at the top level of a hive as `hive` prints it: a
// module (kind "module", its id, and the lines of its block) or another
// cell (kind "invoke" or "other", the printed line).
type topLevel struct {
	kind, name string
	block      string
}

// topLevelCells returns the top-level cells of a hive of cs (after the
// infrastructure that cells.NewHive adds), from its printed objects.
func topLevelCells(t *testing.T, cs ...cell.Cell) []topLevel {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, cells.NewHive(cs...).PrintObjects(&out, slog.New(slog.DiscardHandler)))
	text := out.String()
	if end := strings.Index(text, "\nStart hooks:"); end >= 0 {
		text = text[:end]
	}
	var tops []topLevel
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   "):
			header := strings.TrimSuffix(strings.TrimSpace(line), ":")
			switch {
			case strings.HasPrefix(header, "Ⓜ️ "):
				id, _, _ := strings.Cut(strings.TrimPrefix(header, "Ⓜ️ "), " ")
				tops = append(tops, topLevel{kind: "module", name: id})
			case strings.HasPrefix(header, "🛠️ "):
				tops = append(tops, topLevel{kind: "invoke", name: header})
			default:
				tops = append(tops, topLevel{kind: "other", name: header})
			}
		case len(tops) > 0:
			tops[len(tops)-1].block += line + "\n"
		}
	}
	return tops
}

// TestREADMEControlPlane: the numbered list of "1. Compose the hive" is
// cells.ControlPlane, in order: each module's id and the package of its
// Cell, and the owner lock's Invoke by its file.
func TestREADMEControlPlane(t *testing.T) {
	list := section(t, readme(t), "### 1. Compose the hive")
	item := regexp.MustCompile(`(?m)^\d+\. (.*)$`)
	module := regexp.MustCompile("^`([a-z-]+)` \\(`([a-z]+)\\.Cell`\\)")
	file := regexp.MustCompile("\\(an Invoke, `([^`]+\\.go)`\\)")
	var claimed []string
	for _, m := range item.FindAllStringSubmatch(list, -1) {
		switch {
		case module.MatchString(m[1]):
			mm := module.FindStringSubmatch(m[1])
			claimed = append(claimed, "module "+mm[1]+" of "+mm[2])
		case file.MatchString(m[1]):
			claimed = append(claimed, "invoke in "+file.FindStringSubmatch(m[1])[1])
		default:
			t.Fatalf("README.md: list item %q is neither \"`id` (`package.Cell`)\" nor \"(an Invoke, `file.go`)\"", m[0])
		}
	}

	infrastructure := topLevelCells(t)
	all := topLevelCells(t, cells.ControlPlane)
	require.Equal(t, infrastructure, all[:len(infrastructure)], "the hive's infrastructure comes first")
	var actual []string
	for _, c := range all[len(infrastructure):] {
		switch c.kind {
		case "module":
			// The module's own config, constructors and invokes name
			// its package ("identitycell.Config", "identitycell.newX").
			pkg := regexp.MustCompile(`\b([a-z]+cell)\.`).FindStringSubmatch(c.block)
			require.NotNil(t, pkg, "module %s names no cell package", c.name)
			actual = append(actual, "module "+c.name+" of "+pkg[1])
		case "invoke":
			// "🛠️ cells.registerOwner (.../cells/owner.go:46)"
			loc := regexp.MustCompile(`\(.*?/([^/]+/[^/]+\.go):\d+\)`).FindStringSubmatch(c.name)
			require.NotNil(t, loc, "invoke %q has no location", c.name)
			actual = append(actual, "invoke in "+loc[1])
		default:
			actual = append(actual, c.kind+" "+c.name)
		}
	}
	require.Equal(t, actual, claimed,
		"README.md's list in \"1. Compose the hive\" (right) is not cells.ControlPlane (left)")
}

// TestREADMETables: the table of "3. Read state" lists every table of
// cells.ControlPlane, with its object type and its `db/show` columns.
func TestREADMETables(t *testing.T) {
	text := section(t, readme(t), "### 3. Read state")
	row := regexp.MustCompile("(?m)^\\| `([a-z-]+)` \\| `([^`]+)` \\| [^|]* \\| ([^|]*) \\|")
	type claim struct{ object, columns string }
	claimed := map[string]claim{}
	for _, m := range row.FindAllStringSubmatch(text, -1) {
		claimed[m[1]] = claim{m[2], strings.TrimSpace(m[3])}
	}
	require.NotEmpty(t, claimed, "README.md: no table rows in \"3. Read state\"")

	tablesOf := func(cs ...cell.Cell) map[string]statedb.TableMeta {
		var db *statedb.DB
		h := cells.NewHive(append(cs, cell.Invoke(func(d *statedb.DB) { db = d }))...)
		require.NoError(t, h.Populate(slog.New(slog.DiscardHandler)))
		tables := map[string]statedb.TableMeta{}
		for _, meta := range db.GetTables(db.ReadTxn()) {
			tables[meta.Name()] = meta
		}
		return tables
	}
	infrastructure := tablesOf()
	actual := map[string]claim{}
	for name, meta := range tablesOf(cells.ControlPlane) {
		if _, ok := infrastructure[name]; ok {
			continue
		}
		// The table is a statedb genTable[Obj]: Obj, as a Go reader
		// spells it ("*ipcachecell.Entry").
		typ := reflect.TypeOf(meta).String()
		open, end := strings.Index(typ, "["), strings.LastIndex(typ, "]")
		require.True(t, open >= 0 && end > open, "table %s: cannot tell its object type from %s", name, typ)
		obj := typ[open+1 : end]
		star := strings.HasPrefix(obj, "*")
		obj = obj[strings.LastIndex(obj, "/")+1:]
		if star && !strings.HasPrefix(obj, "*") {
			obj = "*" + obj
		}
		actual[name] = claim{obj, strings.Join(statedb.AnyTable{Meta: meta}.TableHeader(), ", ")}
	}
	require.Equal(t, actual, claimed,
		"README.md's tables in \"3. Read state\" (right) are not cells.ControlPlane's (left)")
}

// TestREADMEFlags: every flag the README names is a flag of the embed
// command, and a default it gives ("`--flag` (value)") is the flag's.
func TestREADMEFlags(t *testing.T) {
	text := readme(t)
	root := newRootCommand(io.Discard, io.Discard)
	lookup := func(name string) string {
		if f := root.Flags().Lookup(name); f != nil {
			return f.DefValue
		}
		if f := root.PersistentFlags().Lookup(name); f != nil {
			return f.DefValue
		}
		t.Errorf("README.md names --%s, which the embed command does not have", name)
		return ""
	}
	named := regexp.MustCompile(`(?:^|[\s`+"`"+`(])--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(text, -1)
	require.NotEmpty(t, named)
	for _, m := range named {
		lookup(m[1])
	}
	for _, m := range regexp.MustCompile("`--([a-z0-9-]+)` \\(([^ ()]+)\\)").FindAllStringSubmatch(text, -1) {
		require.Equal(t, lookup(m[1]), m[2], "README.md: the default of --%s", m[1])
	}
}

// TestREADMEGoNames: every package.Name (and package.Type.Member) the
// README writes, for a package of this module, is declared there.
func TestREADMEGoNames(t *testing.T) {
	text := readme(t)
	dirs := map[string]string{"podcell": "podcell"}
	matches, err := filepath.Glob("../../*/*.go")
	require.NoError(t, err)
	for _, m := range matches {
		dirs[filepath.Base(filepath.Dir(m))] = filepath.Dir(m)
	}
	declared := map[string]map[string]bool{}
	declarations := func(pkg string) map[string]bool {
		if names, ok := declared[pkg]; ok {
			return names
		}
		names := map[string]bool{}
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dirs[pkg], "*.go"))
		require.NoError(t, err)
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil {
						names[d.Name.Name] = true
						continue
					}
					recv := d.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					if ident, ok := recv.(*ast.Ident); ok {
						names[ident.Name+"."+d.Name.Name] = true
					}
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.TypeSpec:
							names[s.Name.Name] = true
							if st, ok := s.Type.(*ast.StructType); ok {
								for _, field := range st.Fields.List {
									for _, n := range field.Names {
										names[s.Name.Name+"."+n.Name] = true
									}
								}
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								names[n.Name] = true
							}
						}
					}
				}
			}
		}
		declared[pkg] = names
		return names
	}
	checked := 0
	for _, m := range regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`).FindAllStringSubmatch(text, -1) {
		pkg, name := m[1], m[2]
		if _, ok := dirs[pkg]; !ok {
			continue
		}
		if m[3] != "" {
			name += "." + m[3]
		}
		require.True(t, declarations(pkg)[name], "README.md names %s.%s, which package %s does not declare", pkg, name, pkg)
		checked++
	}
	require.NotZero(t, checked)
}

// TestREADMEComposition: the hive the README composes is main.go's.
func TestREADMEComposition(t *testing.T) {
	m := regexp.MustCompile(`(?m)^h := (cells\.NewHive\(.*\))$`).FindStringSubmatch(readme(t))
	require.NotNil(t, m, "README.md: no `h := cells.NewHive(...)` line")
	main, err := os.ReadFile("main.go")
	require.NoError(t, err)
	require.Contains(t, string(main), m[1], "README.md composes the hive unlike main.go")
}

// TestREADMEPodsFile: the README's example pods file is valid, its error
// example is what the parser says of a third line with that identity, and
// the identity range it gives is podcell's.
func TestREADMEPodsFile(t *testing.T) {
	text := readme(t)
	example := regexp.MustCompile("`pods.txt` holds[^`]*(?:`[^`]*`[^`]*)*?```\n((?s:.*?))```").FindStringSubmatch(text)
	require.NotNil(t, example, "README.md: no example pods file")
	pods, err := podcell.Parse("pods.txt", example[1])
	require.NoError(t, err, "README.md's example pods file")
	require.Len(t, pods, strings.Count(strings.TrimSpace(example[1]), "\n")+1)

	require.Contains(t, text, fmt.Sprintf("`%d..%d`", uint32(podcell.MinPodIdentity), uint32(podcell.MaxPodIdentity)),
		"README.md: the range of pod identities")

	said := regexp.MustCompile("`(pods\\.txt:3: [^`]*?) \\.\\.\\.`").FindStringSubmatch(text)
	require.NotNil(t, said, "README.md: no error example `pods.txt:3: ... ...`")
	id := regexp.MustCompile(`identity "(\d+)"`).FindStringSubmatch(said[1])
	require.NotNil(t, id, "README.md's error example names no identity")
	_, err = podcell.Parse("pods.txt", example[1]+"10.244.1.9 "+id[1]+"\n")
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), strings.Join(strings.Fields(said[1]), " ")),
		"README.md's error example %q is not how the parser's error begins: %q", said[1], err)
}

// TestREADMESources: the precedence the README lists is the source
// package's, highest first.
func TestREADMESources(t *testing.T) {
	m := regexp.MustCompile("\\(`source` package: ([^)]+)\\)").FindStringSubmatch(readme(t))
	require.NotNil(t, m, "README.md: no \"(`source` package: ...)\" list")
	var actual []string
	for s := source.KubeAPIServer; s.Valid(); s++ {
		actual = append(actual, s.String())
	}
	require.Equal(t, strings.Join(actual, ", "), strings.Join(strings.Fields(m[1]), " "),
		"README.md's source precedence")
}

// TestREADMEScripts: the README describes each script test, and only
// those.
func TestREADMEScripts(t *testing.T) {
	text := section(t, readme(t), "## Tests")
	var claimed []string
	for _, m := range regexp.MustCompile("(?m)^- `([a-z-]+\\.txtar)`:").FindAllStringSubmatch(text, -1) {
		claimed = append(claimed, m[1])
	}
	files, err := filepath.Glob("testdata/*.txtar")
	require.NoError(t, err)
	var actual []string
	for _, f := range files {
		actual = append(actual, filepath.Base(f))
	}
	slices.Sort(claimed)
	require.Equal(t, actual, claimed, "README.md's script tests (right) are not testdata/*.txtar (left)")
}
