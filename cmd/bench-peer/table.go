// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// printTable prints a row per scenario and mode, with the traffic's
// ratios to the scenario's runs without a filter.
func printTable(out io.Writer, results []Result) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "scenario\tmode\tload\tload CPU\tchange\t"+
		"RR p50\t/none\tRR p99\t/none\tRR/s\t/none\tbulk Gbit/s\t/none\t"+
		"kernel MB\tBPF maps MB\tRSS MB\tloader peak MB\t")
	for _, r := range results {
		none := r.baseline()
		for _, m := range r.Modes {
			fmt.Fprintf(w, "%s %s %s\t%s\t%s\t%s\t%s\t%.1fµs\t%s\t%.1fµs\t%s\t%.0f\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t\n",
				r.Family, r.Lengths, humanCount(r.Prefixes), m.Mode,
				secs(m.LoadSeconds), secs(m.LoadCPUSeconds), millis(m.ChangeMillis),
				m.RRP50Micros, ratio(m.RRP50Micros, none.RRP50Micros),
				m.RRP99Micros, ratio(m.RRP99Micros, none.RRP99Micros),
				m.RRPerSecond, ratio(m.RRPerSecond, none.RRPerSecond),
				m.BulkGbitPerSec, ratio(m.BulkGbitPerSec, none.BulkGbitPerSec),
				mb(m.KernelBytes, m.filter()), mb(m.BPFMapBytes, m.Mode == modeAgent),
				mb(m.UserRSSBytes, m.Mode == modeAgent), mb(m.LoaderPeakRSSBytes, m.filter()))
		}
	}
	w.Flush()
}

// baseline is the traffic without a filter: the mean of the runs before
// and after the filters.
func (r Result) baseline() ModeResult {
	var b ModeResult
	n := 0.0
	for _, m := range r.Modes {
		if m.filter() {
			continue
		}
		b.RRP50Micros += m.RRP50Micros
		b.RRP99Micros += m.RRP99Micros
		b.RRPerSecond += m.RRPerSecond
		b.BulkGbitPerSec += m.BulkGbitPerSec
		n++
	}
	if n > 0 {
		b.RRP50Micros, b.RRP99Micros, b.RRPerSecond, b.BulkGbitPerSec = b.RRP50Micros/n, b.RRP99Micros/n, b.RRPerSecond/n, b.BulkGbitPerSec/n
	}
	return b
}

func (m ModeResult) filter() bool { return m.Mode == modeAgent || m.Mode == modeNft }

func ratio(v, base float64) string {
	if base == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v/base)
}

func secs(s float64) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fs", s)
}

func millis(ms float64) string {
	if ms == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fms", ms)
}

func mb(b int64, applies bool) string {
	if !applies {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(b)/1e6)
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

// printNamesTable prints a row per mode of the names comparison, with the
// query's ratios to the forwarding resolver's (no filter).
func printNamesTable(out io.Writer, r NamesResult) {
	var fwd NamesModeResult
	for _, m := range r.Modes {
		if m.Mode == modeForward {
			fwd = m
		}
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "names\tmode\tquery p50\t/forward\tquery p99\t/forward\t"+
		"query to connect p50\tp99\tfirst dropped\tunasked connects\t")
	for _, m := range r.Modes {
		fmt.Fprintf(w, "%d\t%s\t%.0fµs\t%s\t%.0fµs\t%s\t%.0fµs\t%.0fµs\t%d\t%t\t\n",
			r.Names, m.Mode,
			m.QueryP50Micros, ratio(m.QueryP50Micros, fwd.QueryP50Micros),
			m.QueryP99Micros, ratio(m.QueryP99Micros, fwd.QueryP99Micros),
			m.ConnectP50Micro, m.ConnectP99Micro, m.FirstDropped, m.UnaskedConnects)
	}
	w.Flush()
}
