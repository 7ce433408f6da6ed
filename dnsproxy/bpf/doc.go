// SPDX-License-Identifier: Apache-2.0

// Package bpf holds the DNS steering program of the transparent DNS
// proxy: its C source (steer.c), the BPF object compiled from it for
// little-endian targets (steer_bpfel.o) and the Go that bpf2go generates
// to load it (steer_bpfel.go). Attached at TCX ingress of the host side of
// an endpoint's link, it assigns the endpoint's DNS packets (UDP and TCP
// to port 53, IPv4 and IPv6) to the proxy's socket on the port written
// into its proxy_port variable, and lets them through untouched when no
// such socket exists (steer.c says why the host needs a policy route).
//
// The object and the generated Go are committed, so building needs no C
// toolchain; regenerate with `make generate` (or
// `go generate ./dnsproxy/bpf`) after changing steer.c.
package bpf
