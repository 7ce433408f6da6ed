// SPDX-License-Identifier: Apache-2.0

package bpf

// The second step puts the licence and a note on how to regenerate at the
// top of the generated Go file, which bpf2go itself does not write.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -no-global-types Steer steer.c -- -O2 -g -Wall -Werror -mcpu=v3
//go:generate sh -c "{ echo '// SPDX-License-Identifier: Apache-2.0'; echo; echo '// Regenerate with `make generate` (go generate ./dnsproxy/bpf) after editing steer.c; see ../README.md.'; cat steer_bpfel.go; } > steer_bpfel.go.tmp && mv steer_bpfel.go.tmp steer_bpfel.go"
