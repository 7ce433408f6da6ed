// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// printTable prints each scenario's figures with the floor they are
// measured against and the ratio.
func printTable(out io.Writer, results []result) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "scenario\t"+
		"floor random\tfloor sorted\ttable insert\t/floor\t"+
		"end to end\t/floor\tµs/prefix\tCPU\t/floor CPU\t"+
		"restart\t/end to end\tCPU\t/end to end CPU\tunchanged writes\tskipped\trenumbered\t"+
		"grace release\tupsert p99 idle\tupsert p99 in release\t(to table)\tsamples\t"+
		"heap B/prefix\trestart heap B/prefix\t")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.2f\t%s\t%.2f\t%.2f\t%s\t%.2f\t%s\t%.2f\t%s\t%.2f\t%d\t%d\t%d\t%s\t%.1fms\t%.1fms\t%.1fms\t%d/%d\t%.0f\t%.0f\t\n",
			r.scenario,
			round(r.floorRandom), round(r.floorSorted), round(r.tableInsert), ratio(r.tableInsert, r.floorRandom),
			round(r.endToEnd), r.endToEndRatio(), float64(r.endToEnd.Microseconds())/float64(r.scenario.n),
			round(r.endToEndCPU), ratio(r.endToEndCPU, r.floorRandomCPU),
			round(r.restart), r.restartRatio(), round(r.restartCPU), ratio(r.restartCPU, r.endToEndCPU), r.restartUnchangedWrites, r.restartSkipped, r.restartRenumbered,
			round(r.graceRelease), ms(r.idleP99), ms(r.graceP99), ms(r.graceTableP99), r.idleN, r.graceN,
			r.heapPerPrefix, r.restartHeapPerPrefix)
	}
	w.Flush()
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Microsecond)
}

func humanCount(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
