// SPDX-License-Identifier: Apache-2.0

// Command exported counts, for every Go package of the module, its lines
// of Go code and the size of its exported API, so that moving code
// between packages can be compared before and after:
//
//	go run ./internal/tools/exported [-json] [packages dir...]
//
// With no directory it walks the whole module (found by walking up from
// the working directory to go.mod); with directories it walks only those,
// still naming packages by their path relative to the module root. It
// skips testdata, vendor, hidden and _ directories (as the go command
// does), _test.go files, and generated files (a "// Code generated ...
// DO NOT EDIT." line before the package clause, as go/ast.IsGenerated
// reads it). Build constraints are not evaluated: every other .go file
// counts.
//
// Per package it prints:
//
//   - lines: lines that hold Go code, i.e. not blank and not only comment
//     (all the lines of a multi-line string literal count);
//   - exported: exported top-level identifiers: funcs, types, and each
//     name of a var or const spec, plus exported methods whose receiver's
//     base type is exported (methods of unexported types are not part of
//     the package's API even if their name is exported);
//   - fields: exported fields of exported struct types, each name of a
//     multi-name field counting once and an embedded exported type
//     counting as one (fields of nested anonymous structs do not count).
//
// The output is a table sorted by package path with a TOTAL line, or with
// -json an array of {package, lines, exported, fields}.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// pkgCount is one package's line of the output; its JSON names are the
// ones the -json output promises.
type pkgCount struct {
	Package  string `json:"package"`
	Lines    int    `json:"lines"`
	Exported int    `json:"exported"`
	Fields   int    `json:"fields"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: the flags, the walk, the output, and
// the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("exported", flag.ContinueOnError)
	flags.SetOutput(stderr)
	asJSON := flags.Bool("json", false, "print a JSON array of {package, lines, exported, fields}")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./internal/tools/exported [-json] [packages dir...]")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return 2
	}
	dirs := flags.Args()
	if len(dirs) == 0 {
		dirs = []string{"."}
	}

	var counts []pkgCount
	seen := map[string]bool{} // overlapping directory arguments count a package once
	for _, dir := range dirs {
		root, err := moduleRoot(dir)
		if err != nil {
			fmt.Fprintln(stderr, "exported:", err)
			return 1
		}
		pkgs, err := walk(root, dir)
		if err != nil {
			fmt.Fprintln(stderr, "exported:", err)
			return 1
		}
		for _, p := range pkgs {
			if !seen[p.Package] {
				seen[p.Package] = true
				counts = append(counts, p)
			}
		}
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i].Package < counts[j].Package })

	var err error
	if *asJSON {
		err = writeJSON(stdout, counts)
	} else {
		err = writeTable(stdout, counts)
	}
	if err != nil {
		fmt.Fprintln(stderr, "exported:", err)
		return 1
	}
	return 0
}

// moduleRoot is the directory of the go.mod that holds dir: the packages'
// paths are relative to it whichever directory the walk starts from.
func moduleRoot(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := abs; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod in %s or above", abs)
		}
	}
}

// walk counts every package in start and below; the packages are named by
// their slash-separated path relative to root ("." for root itself) and
// sorted by it.
func walk(root, start string) ([]pkgCount, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	start, err = filepath.Abs(start)
	if err != nil {
		return nil, err
	}
	var counts []pkgCount
	err = filepath.WalkDir(start, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != start && skipDir(d.Name()) {
			return filepath.SkipDir
		}
		// A go.mod below the root starts another module, whose packages
		// are not this module's.
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		c, ok, err := countDir(path)
		if err != nil || !ok {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		c.Package = filepath.ToSlash(rel)
		counts = append(counts, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i].Package < counts[j].Package })
	return counts, nil
}

// skipDir says which directories the go command ignores for ./... and are
// therefore no package of the module.
func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" ||
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// countDir counts the package in dir. ok is false when dir holds no
// non-test .go file, i.e. no package (a directory of only generated files
// is a package with nothing counted).
func countDir(dir string) (c pkgCount, ok bool, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return c, false, err
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") ||
			strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			continue
		}
		ok = true
		path := filepath.Join(dir, name)
		src, err := os.ReadFile(path)
		if err != nil {
			return c, false, err
		}
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return c, false, err
		}
		if ast.IsGenerated(f) {
			continue
		}
		c.Lines += codeLines(src)
		exported, fields := countFile(f)
		c.Exported += exported
		c.Fields += fields
	}
	return c, ok, nil
}

// codeLines counts the lines of src that hold a token other than a
// comment. The scanner's automatic semicolons (literal "\n") are no code.
func codeLines(src []byte) int {
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	s.Init(file, src, nil, 0) // comments are skipped without ScanComments
	lines := map[int]bool{}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue
		}
		first := file.Line(pos)
		last := first + strings.Count(lit, "\n") // a raw string's lines
		for l := first; l <= last; l++ {
			lines[l] = true
		}
	}
	return len(lines)
}

// countFile counts one file's exported top-level identifiers and the
// exported fields of its exported struct types.
func countFile(f *ast.File) (exported, fields int) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil || len(d.Recv.List) == 0 {
				exported++
				continue
			}
			if recv := baseTypeName(d.Recv.List[0].Type); recv != nil && recv.IsExported() {
				exported++
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					exported++
					if st, ok := s.Type.(*ast.StructType); ok {
						fields += exportedFields(st)
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							exported++
						}
					}
				}
			}
		}
	}
	return exported, fields
}

// exportedFields counts the exported field names of st; an embedded field
// is named by its type, so it counts when that type's name is exported.
func exportedFields(st *ast.StructType) int {
	n := 0
	for _, field := range st.Fields.List {
		if len(field.Names) == 0 {
			if name := baseTypeName(field.Type); name != nil && name.IsExported() {
				n++
			}
			continue
		}
		for _, name := range field.Names {
			if name.IsExported() {
				n++
			}
		}
	}
	return n
}

// baseTypeName is the name a receiver or embedded field type is known by:
// T, *T, T[P], pkg.T and the like all give T.
func baseTypeName(expr ast.Expr) *ast.Ident {
	for {
		switch e := expr.(type) {
		case *ast.Ident:
			return e
		case *ast.StarExpr:
			expr = e.X
		case *ast.ParenExpr:
			expr = e.X
		case *ast.IndexExpr:
			expr = e.X
		case *ast.IndexListExpr:
			expr = e.X
		case *ast.SelectorExpr:
			return e.Sel
		default:
			return nil
		}
	}
}

// total sums the counts; its Package is "TOTAL".
func total(counts []pkgCount) pkgCount {
	t := pkgCount{Package: "TOTAL"}
	for _, c := range counts {
		t.Lines += c.Lines
		t.Exported += c.Exported
		t.Fields += c.Fields
	}
	return t
}

// writeTable prints the packages as a table with the numbers right-aligned
// under their headers, so that two runs compare line by line with diff.
func writeTable(w io.Writer, counts []pkgCount) error {
	const header = "PACKAGE"
	width := len(header)
	for _, c := range counts {
		width = max(width, len(c.Package))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s  %8s  %8s  %8s\n", width, header, "LINES", "EXPORTED", "FIELDS")
	for _, c := range append(counts, total(counts)) {
		fmt.Fprintf(&b, "%-*s  %8d  %8d  %8d\n", width, c.Package, c.Lines, c.Exported, c.Fields)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeJSON prints the packages as a JSON array (an empty one, not null,
// when there is no package).
func writeJSON(w io.Writer, counts []pkgCount) error {
	if counts == nil {
		counts = []pkgCount{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(counts); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}
