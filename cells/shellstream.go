// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/liggitt/tabwriter"
	"go.yaml.in/yaml/v3"
)

// Hive's engine holds a command's whole output in memory: statedb's
// db/show and query commands build it in a strings.Builder, return it as
// the command's stdout, and the engine copies it into the State's log
// before the server writes it; with 200k prefixes a `db/show ipcache`
// cost several times its output, 50 of them at once gigabytes
// (docs/SCALE.md). The
// agent's shell streams instead: what a command writes goes to the client
// every streamFlushBytes, and a table is aligned streamTableRows rows at a
// time.
const (
	streamFlushBytes = 32 << 10
	// A table of at most this many rows is aligned as statedb aligns it;
	// a longer one keeps the column widths of the rows before and widens
	// a column where a wider cell first appears.
	streamTableRows = 1024
)

// logStream writes to the client as it goes, through the State's log,
// which the engine writes to the connection (FlushLog), as statedb's
// db/watch does.
type logStream struct {
	s       *script.State
	pending int
}

func (w *logStream) Write(p []byte) (int, error) {
	n, _ := w.s.LogWriter().Write(p)
	w.pending += n
	if w.pending >= streamFlushBytes {
		return n, w.Flush()
	}
	return n, nil
}

// Flush writes what is pending to the client.
//
// Possible errors: the connection's.
func (w *logStream) Flush() error {
	w.pending = 0
	return w.s.FlushLog()
}

// streamedStdout writes a command's stdout to the client itself, a chunk
// at a time: the engine would copy it into the State's log whole first.
// (The command still builds it in memory: the cells' commands do.)
type streamedStdout struct{ script.Cmd }

func (c streamedStdout) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	wait, err := c.Cmd.Run(s, args...)
	if wait == nil {
		return nil, err
	}
	return func(s *script.State) (string, string, error) {
		stdout, stderr, err := wait(s)
		if stdout != "" {
			if werr := writeStdout(s, stdout); werr != nil {
				return "", "", werr
			}
		}
		return "", stderr, err
	}, nil
}

func writeStdout(s *script.State, stdout string) error {
	w := &logStream{s: s}
	// The marker the engine writes before a command's stdout: hive's
	// client and ShellExchange skip it.
	io.WriteString(w, "[stdout]\n")
	for len(stdout) > 0 {
		n := min(len(stdout), streamFlushBytes)
		if _, err := io.WriteString(w, stdout[:n]); err != nil {
			return err
		}
		stdout = stdout[n:]
	}
	return w.Flush()
}

// streamedQuery is statedb's db/show, db/get, db/prefix, db/list or
// db/lowerbound (which it wraps, for its usage and its flags) writing its
// objects to the client as it goes. (Its --out is not served: see
// withoutWrites.)
type streamedQuery struct {
	script.Cmd
	db    *statedb.DB
	query func(tbl statedb.AnyTable, txn statedb.ReadTxn, index string, args []string) (iter.Seq2[any, statedb.Revision], error)
}

func newStreamedQueries(db *statedb.DB, cmds map[string]script.Cmd) {
	wrap := func(name string, query func(statedb.AnyTable, statedb.ReadTxn, string, []string) (iter.Seq2[any, statedb.Revision], error)) {
		if cmd, ok := cmds[name]; ok {
			cmds[name] = streamedQuery{Cmd: cmd, db: db, query: query}
		}
	}
	keyed := func(lookup func(statedb.AnyTable, statedb.ReadTxn, string, string) (iter.Seq2[any, statedb.Revision], error), first bool) func(statedb.AnyTable, statedb.ReadTxn, string, []string) (iter.Seq2[any, statedb.Revision], error) {
		return func(tbl statedb.AnyTable, txn statedb.ReadTxn, index string, args []string) (iter.Seq2[any, statedb.Revision], error) {
			if len(args) < 2 {
				return nil, errors.New("expected table and key")
			}
			objs, err := lookup(tbl, txn, index, args[1])
			if err != nil {
				return nil, fmt.Errorf("query index %s: %w", index, err)
			}
			if first {
				return firstObject(objs), nil
			}
			return objs, nil
		}
	}
	wrap("db/show", func(tbl statedb.AnyTable, txn statedb.ReadTxn, _ string, _ []string) (iter.Seq2[any, statedb.Revision], error) {
		return tbl.All(txn), nil
	})
	wrap("db/get", keyed(statedb.AnyTable.List, true))
	wrap("db/list", keyed(statedb.AnyTable.List, false))
	wrap("db/prefix", keyed(statedb.AnyTable.Prefix, false))
	wrap("db/lowerbound", keyed(statedb.AnyTable.LowerBound, false))
	if cmd, ok := cmds["db/dump"]; ok {
		cmds["db/dump"] = streamedDump{Cmd: cmd, db: db}
	}
}

func firstObject(objs iter.Seq2[any, statedb.Revision]) iter.Seq2[any, statedb.Revision] {
	return func(yield func(any, statedb.Revision) bool) {
		for obj, rev := range objs {
			yield(obj, rev)
			return
		}
	}
}

func (c streamedQuery) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	columns, err := s.Flags.GetStringSlice("columns")
	if err != nil {
		return nil, err
	}
	format, err := s.Flags.GetString("format")
	if err != nil {
		return nil, err
	}
	// db/show has no --index: the primary one.
	index, _ := s.Flags.GetString("index")
	if len(args) < 1 {
		return nil, errors.New("missing table name")
	}
	txn := c.db.ReadTxn()
	meta := c.db.GetTable(txn, args[0])
	if meta == nil {
		return nil, fmt.Errorf("table %q not found", args[0])
	}
	tbl := statedb.AnyTable{Meta: meta}
	objs, err := c.query(tbl, txn, index, args)
	if err != nil {
		return nil, err
	}
	w := &logStream{s: s}
	if err := writeObjects(tbl, objs, w, columns, format); err != nil {
		return nil, err
	}
	return nil, w.Flush()
}

// writeObjects is statedb's (script.go), writing as it goes: the same
// formats, flags and errors.
func writeObjects(tbl statedb.AnyTable, objs iter.Seq2[any, statedb.Revision], w io.Writer, columns []string, format string) error {
	if len(columns) > 0 && format != "table" {
		return errors.New("--columns not supported with non-table formats")
	}
	// What the engine writes before a command's stdout.
	if _, err := io.WriteString(w, "[stdout]\n"); err != nil {
		return err
	}
	switch format {
	case "yaml":
		first := true
		for obj := range objs {
			if !first {
				io.WriteString(w, "---\n")
			}
			first = false
			out, err := yaml.Marshal(obj)
			if err != nil {
				return fmt.Errorf("encode object as YAML: %w", err)
			}
			if _, err := w.Write(out); err != nil {
				return err
			}
		}
		return nil
	case "json":
		for obj := range objs {
			out, err := json.MarshalIndent(obj, "", "  ")
			if err != nil {
				return fmt.Errorf("encode object as JSON: %w", err)
			}
			out = append(out, '\n')
			if _, err := w.Write(out); err != nil {
				return err
			}
		}
		return nil
	case "table":
		header := tbl.TableHeader()
		if header == nil {
			return fmt.Errorf("objects in table %q not TableWritable", tbl.Meta.Name())
		}
		var idxs []int
		if len(columns) > 0 {
			var err error
			if idxs, err = columnIndexes(header, columns); err != nil {
				return err
			}
			header = columns
		}
		// statedb's tabwriter settings.
		tw := tabwriter.NewWriter(w, 5, 4, 3, ' ', tabwriter.RememberWidths)
		// One line buffer for all rows: the garbage of a command over a
		// large table is what makes the collector scan the whole heap again.
		line := appendRow(nil, header, nil)
		tw.Write(line)
		columnCount := len(tbl.TableHeader())
		rows := 0
		for obj := range objs {
			row := tbl.TableRow(obj)
			if len(row) != columnCount {
				return fmt.Errorf("table %q: TableRow returned %d columns, want %d from TableHeader",
					tbl.Meta.Name(), len(row), columnCount)
			}
			line = appendRow(line[:0], row, idxs)
			if _, err := tw.Write(line); err != nil {
				return err
			}
			if rows++; rows%streamTableRows == 0 {
				if err := tw.Flush(); err != nil {
					return err
				}
			}
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown format %q, expected table, yaml or json", format)
}

// appendRow appends the cells of row at idxs (all of them if idxs is nil),
// tab-separated, and a newline.
func appendRow(line []byte, row []string, idxs []int) []byte {
	if idxs == nil {
		for i, cell := range row {
			if i > 0 {
				line = append(line, '\t')
			}
			line = append(line, cell...)
		}
	} else {
		for i, idx := range idxs {
			if i > 0 {
				line = append(line, '\t')
			}
			line = append(line, row[idx]...)
		}
	}
	return append(line, '\n')
}

// columnIndexes are the positions of the named columns in header,
// matched as statedb matches them.
func columnIndexes(header, names []string) ([]int, error) {
	idxs := make([]int, 0, len(names))
next:
	for _, name := range names {
		for i, column := range header {
			if strings.EqualFold(name, column) {
				idxs = append(idxs, i)
				continue next
			}
		}
		return nil, fmt.Errorf("column %q not part of %v", name, header)
	}
	return idxs, nil
}

// streamedDump is statedb's db/dump writing the JSON to the client as it
// goes.
type streamedDump struct {
	script.Cmd
	db *statedb.DB
}

func (c streamedDump) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	w := &logStream{s: s}
	io.WriteString(w, "[stdout]\n")
	if err := c.db.ReadTxn().WriteJSON(w); err != nil {
		return nil, err
	}
	return nil, w.Flush()
}
