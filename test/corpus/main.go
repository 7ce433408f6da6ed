// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// config is the command line.
type config struct {
	manifest string
	mirrors  []string
	out      string
	agent    string
	enforce  bool
	timeout  time.Duration
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "corpus:", err)
		os.Exit(2)
	}
	if err := runCorpus(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "corpus:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("corpus", flag.ContinueOnError)
	cfg := config{}
	var mirrors string
	fs.StringVar(&cfg.manifest, "manifest", "test/corpus/sources.tsv", "the corpus manifest")
	fs.StringVar(&mirrors, "mirrors", "", "directories of the repositories' mirrors, colon-separated: <dir>/<owner+name>/repo (a git directory) or <dir>/<owner+name>/<commit>/<path> (stored copies)")
	fs.StringVar(&cfg.out, "out", "", "directory to write the files and results to (outside the repository: the files are their authors')")
	fs.StringVar(&cfg.agent, "agent", "bin/ipcache-agent", "the ipcache-agent binary to measure")
	fs.BoolVar(&cfg.enforce, "enforce", false, "also load the accepted files into the agent (root: bpffs, BPF maps) and count those in force")
	fs.DurationVar(&cfg.timeout, "timeout", time.Minute, "how long an agent run may take to list its files")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if mirrors == "" || cfg.out == "" {
		return config{}, errors.New("-mirrors and -out are required")
	}
	cfg.mirrors = filepath.SplitList(mirrors)
	if cfg.enforce && os.Geteuid() != 0 {
		return config{}, errors.New("-enforce needs root (the agent mounts bpffs and creates BPF maps)")
	}
	return cfg, nil
}

// result is one corpus file's outcome.
type result struct {
	Source
	File    string
	Verdict verdict
	Blocker string // for a rejected file
	Agent   string // with -enforce, for an accepted file: "in force", "not written" or the agent's error
}

func runCorpus(cfg config, stdout io.Writer) error {
	agent, err := filepath.Abs(cfg.agent)
	if err != nil {
		return err
	}
	f, err := os.Open(cfg.manifest)
	if err != nil {
		return err
	}
	sources, err := ParseManifest(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.manifest, err)
	}
	filesDir := filepath.Join(cfg.out, "files")
	if err := os.RemoveAll(filesDir); err != nil {
		return err
	}
	names, err := materialize(sources, cfg.mirrors, filesDir)
	if err != nil {
		return err
	}

	results := make([]result, len(sources))
	for i, s := range sources {
		v, err := validate(agent, filesDir, names[i])
		if err != nil {
			return err
		}
		results[i] = result{Source: s, File: names[i], Verdict: v}
		if !v.Valid {
			results[i].Blocker = classify(v.Error)
		}
	}

	var runs []agentRun
	if cfg.enforce {
		runs, err = enforce(agent, filesDir, results, filepath.Join(cfg.out, "agent-runs"), cfg.timeout)
		if err != nil {
			return err
		}
	}

	rep := report{
		Date:    time.Now().UTC(),
		Agent:   agentVersion(agent),
		Results: results,
		Runs:    runs,
		Enforce: cfg.enforce,
	}
	if err := writeResults(filepath.Join(cfg.out, "results.tsv"), results); err != nil {
		return err
	}
	var text strings.Builder
	rep.write(&text)
	if err := os.WriteFile(filepath.Join(cfg.out, "report.md"), []byte(text.String()), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, text.String())
	return err
}

// agentRun is one agent run of the accepted files and what it showed.
type agentRun struct {
	Files      int
	InForce    int
	NotWritten int
	Rejected   []listed
	Reconciled string
	Enforced   string
}

// enforce loads the accepted files into the agent, in rounds without a
// policy name in common, and records each file's state in its result.
func enforce(agent, filesDir string, results []result, work string, timeout time.Duration) ([]agentRun, error) {
	var accepted []string
	var names [][]string
	byFile := map[string]*result{}
	for i := range results {
		if results[i].Verdict.Valid {
			accepted = append(accepted, results[i].File)
			names = append(names, results[i].Verdict.Policies)
			byFile[results[i].File] = &results[i]
		}
	}
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	var runs []agentRun
	for i, group := range rounds(accepted, names) {
		r, err := loadIntoAgent(agent, filesDir, group, filepath.Join(work, fmt.Sprint(i+1)), timeout)
		if err != nil {
			return nil, fmt.Errorf("agent run %d: %w", i+1, err)
		}
		inForce, notWritten, rejected := r.inForce()
		runs = append(runs, agentRun{Files: len(group), InForce: inForce, NotWritten: notWritten,
			Rejected: rejected, Reconciled: r.Reconciled, Enforced: r.Enforced})
		for _, f := range r.Files {
			res := byFile[f.File]
			switch {
			case res == nil:
				return nil, fmt.Errorf("%w: agent run %d lists %s, which it was not given", ErrAgent, i+1, f.File)
			case f.Status != "in force":
				res.Agent = f.Status + ": " + f.Error
			case f.NotWritten > 0:
				res.Agent = fmt.Sprintf("in force, %d entries not in the policy map", f.NotWritten)
			default:
				res.Agent = "in force"
			}
		}
	}
	return runs, nil
}

// agentVersion is the agent's VCS commit, as `version -o json` says, or,
// for a build without one (go build in a git worktree stamps none), the
// commit of the checkout the corpus runs in.
func agentVersion(agent string) string {
	var v struct {
		Commit   string `json:"commit"`
		Modified bool   `json:"modified"`
	}
	if out, err := exec.Command(agent, "version", "-o", "json").Output(); err == nil &&
		json.Unmarshal(out, &v) == nil && v.Commit != "" {
		if v.Modified {
			return "built from " + v.Commit + " with changes"
		}
		return "built from " + v.Commit
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown (no VCS stamp, no git checkout)"
	}
	status, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	commit := strings.TrimSpace(string(head))
	if len(status) > 0 {
		return "checkout at " + commit + " with uncommitted changes (the binary has no VCS stamp)"
	}
	return "checkout at " + commit + " (the binary has no VCS stamp)"
}
