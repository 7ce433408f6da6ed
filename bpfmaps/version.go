// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// AttachedProgram is the program a pinned link of an agent holds.
type AttachedProgram struct {
	// Link is the pin's name (device and hook).
	Link string `json:"link"`
	// Hook is where the kernel says the link is attached: "tcx-ingress"
	// (what the device receives: what the endpoint behind it sends) or
	// "tcx-egress" (what the device sends: what the endpoint receives).
	// Enforces says which of the endpoint's directions that is, because
	// the pin's suffix names the device's hook and reads the other way
	// round to an operator thinking of the endpoint.
	Hook      string `json:"hook"`
	Enforces  string `json:"enforces"`
	ProgramID uint32 `json:"programId"`
	// Name is the kernel's (truncated to 15 characters); Tag the
	// kernel's hash of the instructions, as bpftool prog shows it.
	Name string `json:"name"`
	Tag  string `json:"tag"`
	// BuildProgram is the program of this binary's embedded object that
	// the kernel's tag matches; "" when none does (another build runs).
	BuildProgram string `json:"buildProgram"`
}

// AttachedPrograms reads the programs held by the links an agent pinned
// under bpfRoot; none if it pinned none (no directory). build is the
// binary's embedded object, whose programs the attached ones are compared
// with (AttachedProgram.BuildProgram). It needs the privilege to open pins
// and programs by ID (root).
//
// Possible errors: a pin or program cannot be opened or read (no
// permission).
func AttachedPrograms(bpfRoot string, build *ebpf.CollectionSpec) ([]AttachedProgram, error) {
	dir := LinksDir(bpfRoot)
	names, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pinned links: %w", err)
	}
	var out []AttachedProgram
	for _, name := range names {
		p, err := attachedProgram(filepath.Join(dir, name.Name()), build)
		if err != nil {
			return nil, err
		}
		p.Link = name.Name()
		out = append(out, p)
	}
	return out, nil
}

func attachedProgram(pin string, spec *ebpf.CollectionSpec) (AttachedProgram, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return AttachedProgram{}, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return AttachedProgram{}, fmt.Errorf("pinned link %s: %w", pin, err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return AttachedProgram{}, fmt.Errorf("program %d of pinned link %s: %w", info.Program, pin, err)
	}
	defer prog.Close()
	pinfo, err := prog.Info()
	if err != nil {
		return AttachedProgram{}, fmt.Errorf("program %d of pinned link %s: %w", info.Program, pin, err)
	}
	out := AttachedProgram{ProgramID: uint32(info.Program), Name: pinfo.Name, Tag: pinfo.Tag}
	// A link whose device is gone is still a TCX link, on no ifindex.
	if tcx := info.TCX(); tcx != nil && tcx.Ifindex != 0 {
		switch ebpf.AttachType(tcx.AttachType) {
		case ebpf.AttachTCXIngress:
			out.Hook, out.Enforces = "tcx-ingress", "endpoint egress"
		case ebpf.AttachTCXEgress:
			out.Hook, out.Enforces = "tcx-egress", "endpoint ingress"
		}
	}
	for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
		if hasTag(spec.Programs[name].Instructions, pinfo.Tag) {
			out.BuildProgram = name
			break
		}
	}
	return out, nil
}

// hasTag reports whether insns, as the loader hands them to the kernel,
// have the kernel's tag. A spec's calls of its functions (the program
// calls global functions, which the verifier checks once each) are
// symbolic until the loader resolves them to offsets, and the kernel's
// tag hashes the offsets: ProgramSpec.Compatible, which hashes the spec's
// instructions as they are, matches only a program without calls.
// Marshal resolves them, in place (so on a copy), as the loader does.
func hasTag(insns asm.Instructions, tag string) bool {
	// The object is built for little-endian BPF only (bpf2go -target
	// bpfel), which is also what the library's encoding needs spelled
	// out: it does not take binary.NativeEndian.
	insns = slices.Clone(insns)
	if err := insns.Marshal(io.Discard, binary.LittleEndian); err != nil {
		return false
	}
	ok, err := insns.HasTag(tag, binary.LittleEndian)
	return err == nil && ok
}
