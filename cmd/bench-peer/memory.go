// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// kernelMemory is the kernel's own memory that sets, rules and BPF maps
// take from: unreclaimable slab, per-CPU allocations and vmalloc (/proc/meminfo,
// bytes). Its change over a load is that load's kernel memory, give or take
// what the rest of the machine did meanwhile.
//
// Possible errors: reading /proc/meminfo.
func kernelMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "SUnreclaim:", "Percpu:", "VmallocUsed:":
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo %s: %w", fields[0], err)
			}
			total += kb << 10
		}
	}
	return total, s.Err()
}

// bpfMemlock sums the memlock the kernel charges for the BPF maps and
// programs the process pid holds (/proc/<pid>/fdinfo), each once.
//
// Possible errors: reading the process's fds.
func bpfMemlock(pid int) (maps, progs int64, err error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	seen := map[string]bool{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || (target != "anon_inode:bpf-map" && target != "anon_inode:bpf-prog") {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		var id string
		var memlock int64
		for _, line := range strings.Split(string(info), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch k {
			case "map_id", "prog_id":
				id = k + v
			case "memlock":
				memlock, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		if target == "anon_inode:bpf-map" {
			maps += memlock
		} else {
			progs += memlock
		}
	}
	return maps, progs, nil
}

// processRSS is a process's resident set and its peak (VmRSS, VmHWM), in
// bytes.
//
// Possible errors: reading /proc/<pid>/status.
func processRSS(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak, nil
}
