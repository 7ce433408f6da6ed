// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
)

// versionInfo is `version -o json`.
type versionInfo struct {
	// Module and Version are the main module's path and version
	// ("(devel)" when built from a working tree).
	Module  string `json:"module"`
	Version string `json:"version"`
	// Commit, CommitTime and Modified are what the Go toolchain stamps
	// when it builds from a VCS checkout; "" and false otherwise.
	Commit     string `json:"commit"`
	CommitTime string `json:"commitTime"`
	Modified   bool   `json:"modified"`
	GoVersion  string `json:"goVersion"`
	Platform   string `json:"platform"`
	// BPFObjectSHA256 names the embedded enforcement object; Programs
	// are its programs.
	BPFObjectSHA256 string   `json:"bpfObjectSha256"`
	Programs        []string `json:"programs"`
	// Attached are the programs the pinned links of an agent under
	// --bpf-root hold, read from the kernel (root only), with their tags
	// and which of this build's programs each is ("" for none: another
	// build's program runs). AttachedError says why they could not be
	// read.
	Attached      []bpfmaps.AttachedProgram `json:"attached"`
	AttachedError string                    `json:"attachedError,omitempty"`
}

func newVersionCommand(stdout io.Writer) *cobra.Command {
	bpfRoot := bpfmaps.DefaultRoot
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the build: module version, VCS commit, Go version, the BPF program's tags",
		Long: `version prints the agent's build: the module version, the VCS commit, its
time and whether the tree was modified (as the Go toolchain stamped them),
the Go version, the SHA-256 of the embedded BPF object and its programs.
As root, it also reads the programs held by the links pinned under
--bpf-root, where an agent attached them: their ids and kernel tags (as
bpftool prog shows them), and whether each is this build's program (the
tag is compared with the embedded object's instructions). With -o json,
one JSON object.`,
		Args: agentcmd.UsageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			if output != "text" && output != "json" {
				return agentcmd.UsageError{Err: fmt.Errorf("-o %q: want text or json", output)}
			}
			v, err := buildVersion(bpfRoot)
			if err != nil {
				return err
			}
			if output == "json" {
				encoder := json.NewEncoder(stdout)
				encoder.SetIndent("", "  ")
				return encoder.Encode(v)
			}
			writeVersion(stdout, v)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	cmd.Flags().StringVar(&bpfRoot, "bpf-root", bpfRoot, "bpffs mount where an agent pinned its links")
	return cmd
}

// buildVersion gathers the version.
//
// Possible errors: the embedded BPF object cannot be parsed.
func buildVersion(bpfRoot string) (versionInfo, error) {
	v := versionInfo{GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
		Attached: []bpfmaps.AttachedProgram{}}
	if info, ok := debug.ReadBuildInfo(); ok {
		v.Module, v.Version = info.Main.Path, info.Main.Version
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.time":
				v.CommitTime = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	// The embedded object, described without loading it: its SHA-256 and
	// its programs' names. (A program's kernel tag cannot be computed
	// offline on every kernel: since Linux 6.18 it is another hash;
	// AttachedPrograms compares instead.)
	build, err := bpf.LoadEnforce()
	if err != nil {
		return v, fmt.Errorf("load enforcement program spec: %w", err)
	}
	v.BPFObjectSHA256, v.Programs = bpf.ObjectSHA256(), slices.Sorted(maps.Keys(build.Programs))
	attached, err := bpfmaps.AttachedPrograms(bpfRoot, build)
	if err != nil {
		v.AttachedError = err.Error()
	} else if attached != nil {
		v.Attached = attached
	}
	return v, nil
}

func writeVersion(w io.Writer, v versionInfo) {
	orNone := func(s string) string {
		if s == "" {
			return "unknown"
		}
		return s
	}
	fmt.Fprintf(w, "ipcache-agent %s (%s)\n", orNone(v.Version), v.Module)
	commit := orNone(v.Commit)
	if v.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(w, "Commit: %s %s\nGo: %s %s\nBPF object sha256: %s\n", commit, v.CommitTime, v.GoVersion, v.Platform, v.BPFObjectSHA256)
	fmt.Fprintf(w, "BPF programs: %s\n", strings.Join(v.Programs, ", "))
	switch {
	case v.AttachedError != "":
		fmt.Fprintf(w, "Attached: unknown (%s)\n", v.AttachedError)
	case len(v.Attached) == 0:
		fmt.Fprintln(w, "Attached: none (no pinned links)")
	}
	for _, a := range v.Attached {
		build := "this build's " + a.BuildProgram
		if a.BuildProgram == "" {
			build = "not this build's"
		}
		hook := "not attached"
		if a.Hook != "" {
			hook = a.Hook + ", enforces the " + a.Enforces
		}
		fmt.Fprintf(w, "Attached %s (%s): program %d %s tag %s (%s)\n", a.Link, hook, a.ProgramID, a.Name, a.Tag, build)
	}
}
