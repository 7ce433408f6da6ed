// SPDX-License-Identifier: Apache-2.0

// Package parallel is for test binaries whose tests spend most of their
// time waiting (on agents, grace periods, probes, network namespaces)
// rather than on the CPU: go test's default -test.parallel (GOMAXPROCS)
// leaves a small machine idle while they wait.
package parallel

import (
	"flag"
	"fmt"
	"runtime"
	"strconv"
)

// AtLeast raises -test.parallel to n, for a package's TestMain to call
// before m.Run. It leaves the flag alone when the command line gives it
// (the caller knows better), when GOMAXPROCS is n or more already, and
// when the binary fuzzes (there -test.parallel is the number of fuzzing
// workers, which should stay one per CPU). It parses the command line.
func AtLeast(n int) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given || runtime.GOMAXPROCS(0) >= n || fuzzing() {
		return
	}
	if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
		panic(fmt.Sprintf("set -test.parallel: %v", err))
	}
}

// fuzzing reports whether the binary runs a fuzz target (-test.fuzz) or is
// one of the workers of one.
func fuzzing() bool {
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}
