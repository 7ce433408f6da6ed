// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ownerResource is the benchmark's owner of the N prefixes.
const ownerResource = "bench/owner"

// heapProfile is -memprofile: where to write the heap profile, once.
var heapProfile string

// endToEndOnly is -end-to-end-only: skip the restart and grace steps.
var endToEndOnly bool

// e2eProfile and restartProfile are -e2e-cpuprofile and
// -restart-cpuprofile: where to write a CPU profile of the first
// scenario's end-to-end (restart) step alone, once.
var e2eProfile, restartProfile string

func main() {
	var (
		sizes    = flag.String("sizes", "100000,1000000", "comma-separated numbers of prefixes")
		families = flag.String("families", "ipv4,mixed", "comma-separated key sets: ipv4 (/32 only), mixed (half IPv4 /32, half IPv6 /128)")
		verbose  = flag.Bool("v", false, "log the agents' info messages")
		profile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	)
	flag.StringVar(&heapProfile, "memprofile", "", "write a heap profile taken after the first scenario's end-to-end step to this file")
	flag.StringVar(&e2eProfile, "e2e-cpuprofile", "", "write a CPU profile of the first scenario's end-to-end step alone to this file")
	flag.StringVar(&restartProfile, "restart-cpuprofile", "", "write a CPU profile of the first scenario's restart step alone to this file")
	flag.BoolVar(&endToEndOnly, "end-to-end-only", false, "run steps 1, 2 and 5 only (no restart or grace expiry): for profiling; no ratio line")
	mutexProfile := flag.String("mutexprofile", "", "write a mutex contention profile of the whole run to this file")
	flag.Parse()
	if *mutexProfile != "" {
		runtime.SetMutexProfileFraction(10)
		defer func() {
			if err := writeProfile("mutex", *mutexProfile); err != nil {
				fmt.Fprintln(os.Stderr, "bench-scale:", err)
			}
		}()
	}
	if *profile != "" {
		f, err := os.Create(*profile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-scale: -cpuprofile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*sizes, *families, *verbose, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type scenario struct {
	family string
	n      int
}

func (s scenario) String() string { return fmt.Sprintf("%s %s", s.family, humanCount(s.n)) }

func parseScenarios(sizes, families string) ([]scenario, error) {
	var out []scenario
	for _, family := range strings.Split(families, ",") {
		if family != "ipv4" && family != "mixed" {
			return nil, fmt.Errorf("-families: unknown key set %q (want ipv4 or mixed)", family)
		}
		for _, size := range strings.Split(sizes, ",") {
			n, err := strconv.Atoi(size)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("-sizes: %q is not a positive number", size)
			}
			out = append(out, scenario{family: family, n: n})
		}
	}
	return out, nil
}

func run(sizes, families string, verbose bool, out io.Writer) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (BPF maps and a bpffs mount)")
	}
	scenarios, err := parseScenarios(sizes, families)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	var results []result
	for _, s := range scenarios {
		fmt.Fprintf(os.Stderr, "bench-scale: %s...\n", s)
		r, err := runScenario(s, log)
		if err != nil {
			return fmt.Errorf("run scenario %s: %w", s, err)
		}
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "bench-scale: %s done\n", s)
	}
	printTable(out, results)

	for _, r := range results {
		if endToEndOnly {
			break
		}
		if r.scenario == (scenario{family: "ipv4", n: 1_000_000}) {
			fmt.Fprintf(out, "ratio end_to_end=%.2f restart_writes=%d restart_ratio=%.2f grace_p99_ms=%.1f heap_bytes_per_prefix=%.0f\n",
				r.endToEndRatio(), r.restartUnchangedWrites, r.restartRatio(), ms(r.graceP99), r.heapPerPrefix)
		}
	}
	return nil
}

// runScenario runs the steps over a private bpffs and state directory.
func runScenario(s scenario, log *slog.Logger) (result, error) {
	dir, err := os.MkdirTemp("", "bench-scale-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	bpfRoot := filepath.Join(dir, "bpf")
	// The agent mounts bpffs there; unmount whatever happens.
	defer unix.Unmount(bpfRoot, unix.MNT_DETACH)

	return measure(s, bpfRoot, filepath.Join(dir, "state"), log)
}
