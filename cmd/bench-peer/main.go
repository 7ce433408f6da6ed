// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	var (
		sizes    = flag.String("sizes", "1000,100000,1000000", "numbers of prefixes, comma- or space-separated (empty: none, with -names)")
		families = flag.String("families", "ipv4,mixed", "comma- or space-separated: ipv4, ipv6, mixed (every other prefix IPv6)")
		lengths  = flag.String("lengths", "host", "prefix lengths: host (/32, /128) or mixed (/24 to /32, /48 to /128)")
		modes    = flag.String("modes", "none,agent,nft", "the modes to run, in this order")
		agent    = flag.String("agent", "bin/ipcache-agent", "the agent binary")
		rounds   = flag.Int("rounds", 3, "rounds of traffic per mode (medians are reported)")
		duration = flag.Duration("duration", time.Second, "length of each request/response and each bulk test")
		output   = flag.String("o", "text", "text or json")
		perf     = flag.String("agent-perf", "", "profile the first agent's load with `perf record -g` into this file (its load time is then not comparable)")
		perfChg  = flag.String("agent-perf-change", "", "profile the first agent's change under load with `perf record -g` into this file")
		names    = flag.Int("names", 0, "also compare egress by DNS name over this many names (needs dnsmasq; 0: no)")
	)
	flag.Parse()
	cfg, scenarios, err := parseFlags(*sizes, *families, *lengths, *modes, *agent, *rounds, *duration, *output, *names)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-peer:", err)
		os.Exit(2)
	}
	cfg.agentPerf, cfg.agentPerfDone = *perf, new(bool)
	cfg.agentPerfChange, cfg.agentPerfChangeDone = *perfChg, new(bool)
	cfg.undo = newUndo()
	cfg.undo.onInterrupt(cfg.progress)
	if err := runAll(cfg, scenarios, *output, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-peer:", err)
		os.Exit(1)
	}
}

// parseFlags checks the flags and makes the run's configuration; the
// scenarios are each family at each size.
//
// Possible errors: a flag's value is invalid.
func parseFlags(sizes, families, lengths, modes, agent string, rounds int, duration time.Duration, output string, names int) (config, []scenario, error) {
	cfg := config{agentBinary: agent, rounds: rounds, duration: duration, progress: os.Stderr, names: names}
	if rounds < 1 || duration <= 0 {
		return cfg, nil, errors.New("-rounds and -duration must be positive")
	}
	if names < 0 || names > maxNames {
		return cfg, nil, fmt.Errorf("-names %d: 0 to %d", names, maxNames)
	}
	if output != "text" && output != "json" {
		return cfg, nil, fmt.Errorf("-o %q: text or json", output)
	}
	switch lengths {
	case "host":
	case "mixed":
		cfg.mixedLength = true
	default:
		return cfg, nil, fmt.Errorf("-lengths %q: host or mixed", lengths)
	}
	for _, m := range fields(modes) {
		if m != modeNone && m != modeAgent && m != modeNft {
			return cfg, nil, fmt.Errorf("-modes: %q is not none, agent or nft", m)
		}
		cfg.modes = append(cfg.modes, m)
	}
	if len(cfg.modes) == 0 {
		return cfg, nil, errors.New("-modes: none given")
	}
	var out []scenario
	for _, f := range fields(families) {
		if f != "ipv4" && f != "ipv6" && f != "mixed" {
			return cfg, nil, fmt.Errorf("-families: %q is not ipv4, ipv6 or mixed", f)
		}
		for _, s := range fields(sizes) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 2 {
				return cfg, nil, fmt.Errorf("-sizes: %q is not a number of prefixes of at least 2", s)
			}
			out = append(out, scenario{family: f, n: n})
		}
	}
	if len(out) == 0 && names == 0 {
		return cfg, nil, errors.New("-sizes and -families: no scenario (and no -names)")
	}
	return cfg, out, nil
}

func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

// runAll runs the scenarios in turn, then the names comparison if asked,
// and prints them, after the last one or the first that failed.
//
// Possible errors: the first scenario's that failed; the names
// comparison's (ErrNoDnsmasq); root is needed.
func runAll(cfg config, scenarios []scenario, output string, out io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: network namespaces, bpffs, the agent, nft")
	}
	work, err := os.MkdirTemp("", "bench-peer-")
	if err != nil {
		return err
	}
	defer cfg.undo.add(func() { os.RemoveAll(work) })()
	cfg.work = work
	var results []Result
	var runErr error
	for _, sc := range scenarios {
		start := time.Now()
		r, err := runScenario(cfg, sc)
		if err != nil {
			runErr = fmt.Errorf("%s %s: %w", sc.family, humanCount(sc.n), err)
			break
		}
		fmt.Fprintf(cfg.progress, "bench-peer: %s %s took %s\n", sc.family, humanCount(sc.n), time.Since(start).Round(time.Second))
		results = append(results, r)
	}
	var names *NamesResult
	if cfg.names > 0 && runErr == nil {
		start := time.Now()
		r, err := runNames(cfg, cfg.names)
		if err != nil {
			runErr = err
		} else {
			fmt.Fprintf(cfg.progress, "bench-peer: names %d took %s\n", cfg.names, time.Since(start).Round(time.Second))
			names = &r
		}
	}
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
		// The names comparison is a second JSON value after the array.
		if names != nil {
			if err := enc.Encode(names); err != nil {
				return err
			}
		}
	} else {
		if len(results) > 0 {
			printTable(out, results)
		}
		if names != nil {
			printNamesTable(out, *names)
		}
	}
	return runErr
}
