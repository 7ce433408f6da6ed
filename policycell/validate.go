// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// FileValidation is the outcome of checking one policy file offline: its
// policies, or why the agent would reject it.
type FileValidation struct {
	File     string
	Policies []*policy.Policy
	// Entries is the count of the policy-map entries the file's policies
	// compute (CountEntries), zero when the file does not parse.
	Entries EntryCount
	// Err is nil when the agent would put the file in force.
	Err error
	// Warnings are what the valid file says that the agent reads
	// otherwise than written (policyfile.Parsed.Warnings).
	Warnings []policyfile.Warning
}

// ValidateFiles checks policy files as the agent would read them from its
// policy directory, without one: the same size and type limits, the same
// parser (policyfile.Parse, whose warnings are kept, among them a
// toFQDNs policy whose endpoints no DNS rule of the file intercepts), the
// same count of policy-map entries against the
// policy map's size maxEntries (CountEntries, the agent's
// --policy-map-max-entries), and the same rule for a policy name that
// several files use: files are taken in name order and the first to use a
// name keeps it. The results are in the order of files; a file given twice
// is read twice.
//
// Each result's Err is a *policyfile.FileError wrapping
// policyfile.ErrInvalidPolicy (and ErrTooManyEntries, or
// ErrNameInUse for a name an earlier file has, at the name), ErrTooLarge, ErrNotRegular, or
// the error of opening or reading the file.
func ValidateFiles(files []string, maxEntries int) []FileValidation {
	results := make([]FileValidation, len(files))
	// The columns of each file's policy names, for a name another file has.
	nameColumns := make([][]int, len(files))
	for i, file := range files {
		results[i] = FileValidation{File: file}
		content, err := readPolicyFile(file)
		if err == nil {
			var parsed policyfile.Parsed
			parsed, err = policyfile.ParseFile(file, content)
			results[i].Policies, nameColumns[i], results[i].Warnings = parsed.Policies, parsed.NameColumns, parsed.Warnings
		}
		if err == nil {
			// toFQDNs and DNS rules are taken: the files are checked for
			// an agent with its DNS proxy, which enforces them.
			results[i].Entries, err = CountEntries(file, results[i].Policies, maxEntries)
			if err != nil {
				results[i].Policies = nil
			}
		}
		if err != nil {
			if _, ok := err.(*policyfile.FileError); !ok {
				err = &policyfile.FileError{File: file, Err: err}
			}
			results[i].Err = err
		}
	}
	order := make([]int, len(files))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(files[a], files[b]) })
	holder := map[string]*policy.Policy{}
	for _, i := range order {
		r := &results[i]
		if r.Err != nil {
			continue
		}
		if err := nameConflict(r.File, r.Policies, nameColumns[i], holder); err != nil {
			r.Err, r.Policies = err, nil
			continue
		}
		for _, p := range r.Policies {
			holder[p.Name] = p
		}
	}
	return results
}

// nameConflict is conflict for an offline check: nothing is in force, so
// the error says which file has the name, and is an invalid policy file's
// error at the name's position, as every other error of a file's content.
func nameConflict(file string, policies []*policy.Policy, columns []int, holder map[string]*policy.Policy) error {
	for i, p := range policies {
		if other, held := holder[p.Name]; held && other.File != file {
			column := 0
			if i < len(columns) {
				column = columns[i]
			}
			return &policyfile.FileError{File: file, Line: p.Line, Column: column,
				Err: fmt.Errorf("%w: policy %q: %w by %s:%d (files are taken in name order, the first keeps the name)",
					policyfile.ErrInvalidPolicy, p.Name, ErrNameInUse, other.File, other.Line)}
		}
	}
	return nil
}

// readPolicyFile reads a file as the directory reader does: a FIFO does
// not block the open, and what is not a regular file or is over the cap
// is an error.
func readPolicyFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	content, isDir, err := readOpened(f)
	if isDir {
		return nil, fmt.Errorf("%w: a directory", ErrNotRegular)
	}
	return content, err
}
