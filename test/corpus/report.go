// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// report aggregates the results: the figures the README quotes.
type report struct {
	Date    time.Time
	Agent   string
	Results []result
	Runs    []agentRun
	Enforce bool
}

func percent(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// count is a row of a table: a name and how many files.
type count struct {
	name  string
	n     int
	extra int
}

// sortedCounts orders by count, then name, so that a table reads from
// the biggest row down and is the same from one run to the next.
func sortedCounts(m map[string]*count) []*count {
	var rows []*count
	for _, c := range m {
		rows = append(rows, c)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].n != rows[j].n {
			return rows[i].n > rows[j].n
		}
		return rows[i].name < rows[j].name
	})
	return rows
}

func (r report) write(w io.Writer) {
	total, accepted, documents := len(r.Results), 0, 0
	repos := map[string]*count{}
	kinds := map[string]*count{}
	blockers := map[string]*count{}
	for _, res := range r.Results {
		documents += res.Documents
		repo := repos[res.Repository]
		if repo == nil {
			repo = &count{name: res.Repository}
			repos[res.Repository] = repo
		}
		repo.n++
		kind := kinds[res.Kinds]
		if kind == nil {
			kind = &count{name: res.Kinds}
			kinds[res.Kinds] = kind
		}
		kind.n++
		if res.Verdict.Valid {
			accepted++
			repo.extra++
			kind.extra++
			continue
		}
		b := blockers[res.Blocker]
		if b == nil {
			b = &count{name: res.Blocker}
			blockers[res.Blocker] = b
		}
		b.n++
	}
	rejected := total - accepted

	fmt.Fprintf(w, "# Policy corpus: %s\n\n", r.Date.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Agent: %s\n\n", r.Agent)
	fmt.Fprintf(w, "%d files (%d YAML documents) from %d repositories.\n\n", total, documents, len(repos))
	fmt.Fprintf(w, "Accepted by `policy validate` (each file alone): **%d of %d (%s)**; rejected: %d.\n\n",
		accepted, total, percent(accepted, total), rejected)
	if r.Enforce {
		inForce, notWritten := 0, 0
		var agentRejected []string
		for _, run := range r.Runs {
			inForce += run.InForce
			notWritten += run.NotWritten
			for _, f := range run.Rejected {
				agentRejected = append(agentRejected, f.File+": "+f.Error)
			}
		}
		fmt.Fprintf(w, "Loaded into the agent (--policy-dir, no --devices; %d runs, the accepted files split so that no run has a policy name twice): "+
			"**%d of %d accepted files in force** with every entry in the policy map, %d in force with entries not in the map, %d rejected by the agent.\n\n",
			len(r.Runs), inForce, accepted, notWritten, len(agentRejected))
		fmt.Fprintln(w, "| run | files | in force | entries not in the map | rejected | policy map reconciler | enforcement |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		for i, run := range r.Runs {
			fmt.Fprintf(w, "| %d | %d | %d | %d | %d | %s | %s |\n", i+1, run.Files, run.InForce, run.NotWritten, len(run.Rejected), run.Reconciled, run.Enforced)
		}
		fmt.Fprintln(w)
		for _, line := range agentRejected {
			fmt.Fprintf(w, "- rejected by the agent: %s\n", line)
		}
		if len(agentRejected) > 0 {
			fmt.Fprintln(w)
		}
	}

	fmt.Fprintln(w, "## What blocks the rejected files (the first error of each)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| blocker | files | of the rejected | of all |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, b := range sortedCounts(blockers) {
		fmt.Fprintf(w, "| %s | %d | %s | %s |\n", b.name, b.n, percent(b.n, rejected), percent(b.n, total))
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "## By kind")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| kinds in the file | files | accepted |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, k := range sortedCounts(kinds) {
		fmt.Fprintf(w, "| %s | %d | %d |\n", k.name, k.n, k.extra)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "## By repository")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| repository | files | accepted |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, repo := range sortedCounts(repos) {
		fmt.Fprintf(w, "| %s | %d | %d |\n", repo.name, repo.n, repo.extra)
	}
	fmt.Fprintln(w)

	var others []string
	for _, res := range r.Results {
		if formatBlockers[res.Blocker] || strings.HasPrefix(res.Blocker, "unknown field ") {
			others = append(others, res.File+": "+res.Verdict.Error)
		}
	}
	if len(others) > 0 {
		fmt.Fprintln(w, "## The files rejected for their form, not for a policy feature")
		fmt.Fprintln(w)
		for _, o := range others {
			fmt.Fprintf(w, "- %s\n", o)
		}
		fmt.Fprintln(w)
	}
}

// writeResults writes one tab-separated line per file: the file name, its
// source, the verdict, the blocker and the first error, and the agent's
// state of it.
func writeResults(path string, results []result) error {
	var b strings.Builder
	b.WriteString("file\trepository\tcommit\tpath\tkinds\tvalid\tpolicies\tentries\tblocker\terror\tagent\n")
	clean := strings.NewReplacer("\t", " ", "\n", " ")
	for _, r := range results {
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%s\t%t\t%s\t%d\t%s\t%s\t%s\n",
			r.File, r.Repository, r.Commit, r.Path, r.Kinds, r.Verdict.Valid,
			strings.Join(r.Verdict.Policies, ","), r.Verdict.Entries, r.Blocker,
			clean.Replace(r.Verdict.Error), clean.Replace(r.Agent))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
