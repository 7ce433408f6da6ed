// SPDX-License-Identifier: Apache-2.0

// Package bpf holds the agent's enforcement program: its C source
// (enforce.c), the BPF object compiled from it for little-endian targets
// (enforce_bpfel.o) and the Go that bpf2go generates to load it
// (enforce_bpfel.go).
//
// The object and the generated Go are committed, so building the agent needs
// no C toolchain. After changing enforce.c, regenerate them with
// `make generate` (or `go generate ./datapathcell/bpf`); README.md lists what
// that needs.
//
// The package only embeds the object. datapathcell loads it with LoadEnforce,
// replacing the maps the C program declares with the agent's pinned maps, and
// attaches the programs (EnforceProgEnforceFromEndpoint at TCX ingress,
// EnforceProgEnforceToEndpoint at TCX egress of a device).
//
// Only little-endian architectures are built: the maps' integers are
// little-endian by contract (docs/CONTRACT.md, "BPF maps and pins").
package bpf
