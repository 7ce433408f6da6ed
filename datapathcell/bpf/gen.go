// SPDX-License-Identifier: Apache-2.0

package bpf

// The second step puts the licence and a note on how to regenerate at the
// top of the generated Go file, which bpf2go itself does not write.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -no-global-types -type event -type dns_answer Enforce enforce.c -- -O2 -g -Wall -Werror -mcpu=v3
//go:generate sh -c "{ echo '// SPDX-License-Identifier: Apache-2.0'; echo; echo '// Regenerate with `make generate` (go generate ./datapathcell/bpf) after editing enforce.c; see README.md.'; cat enforce_bpfel.go; } > enforce_bpfel.go.tmp && mv enforce_bpfel.go.tmp enforce_bpfel.go"
