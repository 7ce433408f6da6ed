// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// newPolicyCommand is `policy`, whose one command is `validate`.
func newPolicyCommand(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Work with policy files offline",
		Args:  agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			return agentcmd.UsageError{Err: errors.New("policy needs a command: validate")}
		},
	}
	cmd.AddCommand(newValidateCommand(stdout))
	return cmd
}

// validation is one file's line of `policy validate -o json`.
type validation struct {
	File     string   `json:"file"`
	Valid    bool     `json:"valid"`
	Policies []string `json:"policies"`
	Kinds    []string `json:"kinds,omitempty"`
	Error    string   `json:"error,omitempty"`
	// Warnings are "file:line:col: message", for what a file says that
	// the agent reads otherwise than written.
	Warnings []string `json:"warnings,omitempty"`
	Line     int      `json:"line,omitempty"`
	Column   int      `json:"column,omitempty"`
	// Entries are the policy map entries the file computes; EntriesExact
	// is false when counting stopped there (a file far over the limit).
	Entries      int  `json:"entries"`
	EntriesExact bool `json:"entriesExact"`
}

func newValidateCommand(stdout io.Writer) *cobra.Command {
	var output string
	var maxEntries uint32
	cmd := &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check policy files as the agent would read them, without an agent",
		Long: `validate reads each policy file with the agent's parser and checks: the
formats (native, CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy,
NetworkPolicy, List), what the agent cannot enforce, the size limit,
the policy map entries each file's policies compute (rejected over
--policy-map-max-entries, at the rule that passes it), and policy names
used by several of the files (taken in name order, the first keeps the
name, as in a policy directory). It prints one line per file,
"FILE: ok (N policies: names; M policy map entries)" or the agent's
error, or with -o json one JSON document; what a valid file says that
the agent reads otherwise than written (a CIDR with host bits set) is a
"warning: FILE:LINE:COL: ..." line on stderr (in the JSON, "warnings").
Exit codes: 0 every file valid, 1 a file invalid, 2 no file or bad flags.`,
		Args: agentcmd.UsageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, files []string) error {
			if output != "text" && output != "json" {
				return agentcmd.UsageError{Err: fmt.Errorf("-o %q: want text or json", output)}
			}
			if maxEntries == 0 {
				return agentcmd.UsageError{Err: errors.New("--policy-map-max-entries must be positive")}
			}
			results := policycell.ValidateFiles(files, int(maxEntries))
			invalid, total := 0, 0
			out := make([]validation, len(results))
			for i, r := range results {
				out[i] = validation{File: r.File, Valid: r.Err == nil, Policies: []string{},
					Entries: r.Entries.Entries, EntriesExact: r.Entries.Exact}
				if r.Err == nil {
					total += r.Entries.Entries
				}
				for _, w := range r.Warnings {
					out[i].Warnings = append(out[i].Warnings, w.String())
					if output == "text" {
						fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w.String())
					}
				}
				for _, p := range r.Policies {
					out[i].Policies = append(out[i].Policies, p.Name)
					out[i].Kinds = append(out[i].Kinds, p.Kind)
				}
				if r.Err != nil {
					invalid++
					out[i].Error = r.Err.Error()
					var fileErr *policyfile.FileError
					if errors.As(r.Err, &fileErr) {
						out[i].Line, out[i].Column = fileErr.Line, fileErr.Column
					}
				}
			}
			if output == "json" {
				encoder := json.NewEncoder(stdout)
				encoder.SetIndent("", "  ")
				if err := encoder.Encode(struct {
					Valid               bool         `json:"valid"`
					Entries             int          `json:"entries"`
					PolicyMapMaxEntries uint32       `json:"policyMapMaxEntries"`
					Files               []validation `json:"files"`
				}{invalid == 0, total, maxEntries, out}); err != nil {
					return err
				}
			} else {
				for _, v := range out {
					if v.Valid {
						fmt.Fprintf(stdout, "%s: ok (%s: %s; %s)\n", v.File, plural(len(v.Policies), "policy", "policies"),
							strings.Join(v.Policies, ", "), plural(v.Entries, "policy map entry", "policy map entries"))
					} else {
						// The error names the file.
						fmt.Fprintln(stdout, v.Error)
					}
				}
			}
			if total > int(maxEntries) {
				// Each file fits, but not all of them together: the agent
				// puts them in force and writes what fits (docs/FAULTS.md).
				fmt.Fprintf(cmd.ErrOrStderr(), "ipcache-agent: note: the valid files compute %d policy map entries together, "+
					"more than the policy map holds (%d, --policy-map-max-entries): the agent puts them in force, "+
					"and the entries that do not fit are not in the policy map (their traffic is dropped)\n", total, maxEntries)
			}
			if invalid > 0 {
				return fmt.Errorf("%w: %d of %d", errInvalidPolicyFiles, invalid, len(files))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	cmd.Flags().Uint32Var(&maxEntries, "policy-map-max-entries", datapathcell.DefaultConfig.PolicyMapMaxEntries,
		"Maximum entries of the policy map, as the agent's flag: a file whose policies compute more is invalid")
	return cmd
}

// plural returns "1 policy", "2 policies".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
