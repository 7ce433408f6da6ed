// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rounds splits the accepted files into groups without a policy name in
// common, in order: a policy directory takes a name once, and files of
// unrelated repositories share names (default/deny-all) that say nothing
// of the files, so each group is loaded by an agent run of its own.
// names[i] are the policy names of files[i].
func rounds(files []string, names [][]string) [][]string {
	var groups [][]string
	var taken []map[string]bool
	for i, file := range files {
		placed := false
		for g := range groups {
			if !anyTaken(taken[g], names[i]) {
				groups[g] = append(groups[g], file)
				takeAll(taken[g], names[i])
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []string{file})
			taken = append(taken, map[string]bool{})
			takeAll(taken[len(taken)-1], names[i])
		}
	}
	return groups
}

func anyTaken(taken map[string]bool, names []string) bool {
	for _, n := range names {
		if taken[n] {
			return true
		}
	}
	return false
}

func takeAll(taken map[string]bool, names []string) {
	for _, n := range names {
		taken[n] = true
	}
}

// listed is a file of `policy/list -o json`.
type listed struct {
	File       string `json:"file"`
	Status     string `json:"status"`
	NotWritten int    `json:"notWritten"`
	Error      string `json:"error"`
	Policies   []struct {
		Name string `json:"name"`
	} `json:"policies"`
}

// run is what one agent run over a policy directory showed.
type run struct {
	Files      []listed
	Reconciled string // the health of the policy map's reconciler
	Enforced   string // the health of the enforcement map's writer
}

var healthPattern = regexp.MustCompile(`(?m)^(datapath\.job-reconcile-policy|datapath\.job-write-enforcement-map): level=(\S+) message=(.*?)(?: error=(.*))?$`)

// loadIntoAgent starts the agent with --policy-dir on a directory holding
// the files, on a private bpffs mount, state directory and shell socket
// under work, and no --devices; waits until `policy/list` lists every
// file; reads it and the policy map's health; stops the agent, runs
// `cleanup` and unmounts the bpffs. It needs root.
//
// Possible errors: ErrAgent when the agent exits early or does not list
// every file within the timeout; errors of copying the files.
func loadIntoAgent(agent, filesDir string, files []string, work string, timeout time.Duration) (run, error) {
	policyDir := filepath.Join(work, "policies")
	stateDir := filepath.Join(work, "state")
	bpfRoot := filepath.Join(work, "bpf")
	sock := filepath.Join(work, "shell.sock")
	for _, dir := range []string{policyDir, stateDir, bpfRoot} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return run{}, err
		}
	}
	for _, f := range files {
		content, err := os.ReadFile(filepath.Join(filesDir, f))
		if err != nil {
			return run{}, err
		}
		if err := os.WriteFile(filepath.Join(policyDir, f), content, 0o644); err != nil {
			return run{}, err
		}
	}
	logFile, err := os.Create(filepath.Join(work, "agent.log"))
	if err != nil {
		return run{}, err
	}
	defer logFile.Close()

	common := []string{"--bpf-root=" + bpfRoot, "--state-dir=" + stateDir, "--shell-sock-path=" + sock}
	cmd := exec.Command(agent, append(common, "--policy-dir="+policyDir)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return run{}, fmt.Errorf("%w: start %s: %w", ErrAgent, agent, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		stopAgent(cmd, exited)
		// What the agent leaves (pins, state files) goes with cleanup,
		// then the private bpffs mount it made on --bpf-root.
		if out, err := exec.Command(agent, append([]string{"cleanup"}, common...)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "corpus: cleanup of %s: %v: %s\n", work, err, out)
		}
		if err := unix.Unmount(bpfRoot, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			fmt.Fprintf(os.Stderr, "corpus: unmount %s: %v\n", bpfRoot, err)
		}
	}()

	shell := func(args ...string) ([]byte, error) {
		return exec.Command(agent, append([]string{"shell", "--shell-sock-path=" + sock}, args...)...).Output()
	}
	deadline := time.Now().Add(timeout)
	var last, previous string
	for {
		select {
		case err := <-exited:
			exited <- err
			return run{}, fmt.Errorf("%w: the agent exited: %v (log: %s)", ErrAgent, err, logFile.Name())
		default:
		}
		out, err := shell("policy/list", "-o", "json")
		if err == nil {
			var list []listed
			if json.Unmarshal(out, &list) == nil && len(list) == len(files) {
				health, err := shell("health")
				// It exits 1 while a scope is degraded (a rejected
				// file's): its rows are still what is read.
				if exitErr := (*exec.ExitError)(nil); errors.As(err, &exitErr) && exitErr.ExitCode() == 1 {
					err = nil
				}
				if err != nil {
					return run{}, fmt.Errorf("%w: health: %v", ErrAgent, err)
				}
				r := run{Files: list}
				for _, m := range healthPattern.FindAllStringSubmatch(string(health), -1) {
					text := m[2] + ": " + m[3]
					if m[1] == "datapath.job-reconcile-policy" {
						r.Reconciled = text
					} else {
						r.Enforced = text
					}
				}
				// The reconciler's "OK, N object(s)" twice in a row: every
				// entry of the files is in the policy map, none pending.
				if strings.HasPrefix(r.Reconciled, "OK: OK") && r.Reconciled == previous {
					return r, nil
				}
				previous = r.Reconciled
				last = "policy map reconciler: " + r.Reconciled
			} else {
				last = fmt.Sprintf("policy/list: %d of %d files", len(list), len(files))
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return run{}, fmt.Errorf("%w: not ready within %s: %s (log: %s)", ErrAgent, timeout, last, logFile.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stopAgent stops the agent as an operator does (SIGTERM), and kills it
// if it does not stop.
func stopAgent(cmd *exec.Cmd, exited chan error) {
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// inForce counts the files a run lists in force with every entry in the
// policy map.
func (r run) inForce() (inForce, notWritten int, rejected []listed) {
	for _, f := range r.Files {
		switch {
		case f.Status != "in force":
			rejected = append(rejected, f)
		case f.NotWritten > 0:
			notWritten++
		default:
			inForce++
		}
	}
	return inForce, notWritten, rejected
}
