// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The modes, in the order a scenario runs them.
const (
	modeNone  = "none"
	modeAgent = "agent"
	modeNft   = "nft"
	// modeNoneAfter is none again, after the filters.
	modeNoneAfter = "none-after"
)

// config is what every scenario of a run shares.
type config struct {
	agentBinary string
	modes       []string
	rounds      int
	duration    time.Duration // of each request/response and bulk test
	mixedLength bool
	work        string // scratch directory: policy files, the agent's dirs
	names       int    // names of the names comparison (0: none)
	// agentPerf is where `perf record` writes a profile of the first
	// agent's load (empty: none); done once written.
	agentPerf     string
	agentPerfDone *bool
	// agentPerfChange is the same for the first agent's change under
	// load.
	agentPerfChange     string
	agentPerfChangeDone *bool
	progress            io.Writer // a line per step
	// undo removes what the run made if it is interrupted (nil: not).
	undo *undo
}

type scenario struct {
	family string
	n      int
}

// Result is one scenario's figures, each mode's in the same namespaces.
type Result struct {
	Family   string `json:"family"`
	Lengths  string `json:"lengths"`
	Prefixes int    `json:"prefixes"`
	// TrafficAddress is the server's address the traffic goes to.
	TrafficAddress string       `json:"trafficAddress"`
	Modes          []ModeResult `json:"modes"`
}

// ModeResult is one mode's figures. Times of traffic are medians over the
// rounds.
type ModeResult struct {
	Mode           string  `json:"mode"`
	RRP50Micros    float64 `json:"rrP50Micros"`
	RRP99Micros    float64 `json:"rrP99Micros"`
	RRPerSecond    float64 `json:"rrPerSecond"`
	BulkGbitPerSec float64 `json:"bulkGbitPerSecond"`
	// LoadSeconds: agent, from its start until all prefixes are enforced;
	// nft, `nft -f` from start to exit. LoadCPUSeconds is the loader's
	// CPU (user and system) meanwhile.
	LoadSeconds    float64 `json:"loadSeconds"`
	LoadCPUSeconds float64 `json:"loadCPUSeconds"`
	// ChangeMillis: from the change's start (a policy file written, `nft
	// add element` run) until a connection to the new address succeeds,
	// while request/response traffic runs.
	ChangeMillis float64 `json:"changeMillis"`
	// KernelBytes: the kernel's unreclaimable slab, per-CPU and vmalloc
	// memory after the load less before it.
	KernelBytes int64 `json:"kernelBytes"`
	// BPFMapBytes, BPFProgBytes: the memlock of the agent's maps and
	// programs.
	BPFMapBytes  int64 `json:"bpfMapBytes"`
	BPFProgBytes int64 `json:"bpfProgBytes"`
	// UserRSSBytes: what stays resident in user space to enforce (the
	// agent's RSS; nft's is 0, nothing runs). LoaderPeakRSSBytes: the
	// loading process's peak.
	UserRSSBytes       int64 `json:"userRssBytes"`
	LoaderPeakRSSBytes int64 `json:"loaderPeakRssBytes"`
	// The enforcement check: the server's allowed address(es) connect,
	// its outside address (in no policy) and the change's address before
	// the change do not (under a filter; both do with none).
	AllowedConnects bool `json:"allowedConnects"`
	OutsideConnects bool `json:"outsideConnects"`
	ChangeConnects  bool `json:"changeConnectsBefore"`
}

// ErrNotFiltering is a filter that lets through what its policy does not
// allow, or blocks what it allows: its figures would not be a filter's.
var ErrNotFiltering = errors.New("the filter does not enforce the policy")

// servers is the server's addresses the scenario's family has.
func (s scenario) servers() []serverAddrs {
	switch s.family {
	case "ipv4":
		return []serverAddrs{serverV4}
	case "ipv6":
		return []serverAddrs{serverV6}
	}
	return []serverAddrs{serverV4, serverV6}
}

// traffic is the server's address the traffic goes to: IPv6 but for the
// ipv4 family.
func (s scenario) traffic() serverAddrs {
	if s.family == "ipv4" {
		return serverV4
	}
	return serverV6
}

// runScenario builds the namespaces, runs each mode in them and removes
// them.
//
// Possible errors: ErrNotFiltering; the namespaces, the agent, nft or the
// traffic failed.
func runScenario(cfg config, sc scenario) (Result, error) {
	lengths := "host"
	if cfg.mixedLength {
		lengths = "mixed"
	}
	res := Result{Family: sc.family, Lengths: lengths, Prefixes: sc.n, TrafficAddress: sc.traffic().allowed}
	topo, err := newTopology(fmt.Sprintf("bpeer-%d", os.Getpid()))
	if err != nil {
		return res, err
	}
	defer cfg.undo.add(topo.remove)()
	srv, err := startServer(topo.server)
	if err != nil {
		return res, err
	}
	defer srv.close()
	// A fresh veth takes a moment before it carries traffic.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := connects(topo.client, sc.traffic().allowed, 200*time.Millisecond)
		if err != nil {
			return res, err
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return res, errors.New("the client does not reach the server through the router")
		}
	}
	prefixes := policyPrefixes(sc.n, sc.family, cfg.mixedLength)
	modes := cfg.modes
	// Without a filter is measured again after the filters, when there
	// are any: the machine's speed drifts over a scenario, and the ratios
	// are to the mean of both.
	if slices.Contains(modes, modeNone) && len(modes) > 1 {
		modes = append(slices.Clone(modes), modeNoneAfter)
	}
	for _, mode := range modes {
		fmt.Fprintf(cfg.progress, "bench-peer: %s %s %s: %s\n", sc.family, lengths, humanCount(sc.n), mode)
		var m ModeResult
		var err error
		switch mode {
		case modeNone, modeNoneAfter:
			m, err = runNone(cfg, sc, topo, srv)
			m.Mode = mode
		case modeAgent:
			m, err = runAgent(cfg, sc, topo, srv, prefixes)
		case modeNft:
			m, err = runNft(cfg, sc, topo, srv, prefixes)
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", mode, err)
		}
		res.Modes = append(res.Modes, m)
	}
	return res, nil
}

func runNone(cfg config, sc scenario, topo *topology, srv *server) (ModeResult, error) {
	m := ModeResult{Mode: modeNone}
	if err := check(&m, sc, topo, false); err != nil {
		return m, err
	}
	return m, measureTraffic(cfg, &m, sc, topo, srv)
}

func runAgent(cfg config, sc scenario, topo *topology, srv *server, prefixes []netip.Prefix) (ModeResult, error) {
	m := ModeResult{Mode: modeAgent}
	work, err := os.MkdirTemp(cfg.work, "agent-")
	if err != nil {
		return m, err
	}
	a, err := newAgentRun(cfg.agentBinary, topo.router, work)
	if err != nil {
		return m, err
	}
	defer cfg.undo.add(a.stop)()
	if _, err := writeAgentPolicies(a.policyDir, prefixes); err != nil {
		return m, err
	}
	before, err := settledKernelMemory()
	if err != nil {
		return m, err
	}
	start := time.Now()
	if err := a.start(sc.n); err != nil {
		return m, err
	}
	stopPerf := func() {}
	if cfg.agentPerf != "" && !*cfg.agentPerfDone {
		*cfg.agentPerfDone = true
		if stopPerf, err = startPerf(cfg.agentPerf, a.pid()); err != nil {
			return m, err
		}
		stopPerf = cfg.undo.add(stopPerf)
	}
	err = a.waitEnforced(sc.n, 20*time.Millisecond, 15*time.Minute)
	m.LoadSeconds = time.Since(start).Seconds()
	stopPerf()
	if err != nil {
		return m, err
	}
	m.LoadCPUSeconds = processCPU(a.pid())
	after, err := kernelMemory()
	if err != nil {
		return m, err
	}
	m.KernelBytes = after - before
	if m.BPFMapBytes, m.BPFProgBytes, err = bpfMemlock(a.pid()); err != nil {
		return m, err
	}
	if m.UserRSSBytes, m.LoaderPeakRSSBytes, err = processRSS(a.pid()); err != nil {
		return m, err
	}
	if err := check(&m, sc, topo, true); err != nil {
		return m, fmt.Errorf("%w (agent log: %s)", err, a.log.Name())
	}
	if err := measureTraffic(cfg, &m, sc, topo, srv); err != nil {
		return m, err
	}
	var change []netip.Prefix
	for _, s := range sc.servers() {
		change = append(change, netip.PrefixFrom(netip.MustParseAddr(s.change), netip.MustParseAddr(s.change).BitLen()))
	}
	stopPerf = func() {}
	if cfg.agentPerfChange != "" && !*cfg.agentPerfChangeDone {
		*cfg.agentPerfChangeDone = true
		if stopPerf, err = startPerf(cfg.agentPerfChange, a.pid()); err != nil {
			return m, err
		}
		stopPerf = cfg.undo.add(stopPerf)
	}
	m.ChangeMillis, err = changeUnderLoad(sc, topo, func() error {
		return writeAgentPolicy(a.policyDir, "bpeer-change", change)
	})
	stopPerf()
	return m, err
}

func runNft(cfg config, sc scenario, topo *topology, srv *server, prefixes []netip.Prefix) (ModeResult, error) {
	m := ModeResult{Mode: modeNft}
	ruleset := filepath.Join(cfg.work, "ruleset.nft")
	if err := writeNftRuleset(ruleset, prefixes); err != nil {
		return m, err
	}
	defer os.Remove(ruleset)
	defer func() {
		_ = exec.Command("ip", "netns", "exec", topo.router, "nft", "delete", "table", "inet", nftTable).Run()
	}()
	before, err := settledKernelMemory()
	if err != nil {
		return m, err
	}
	cmd := exec.Command("ip", "netns", "exec", topo.router, "nft", "-f", ruleset)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	m.LoadSeconds = time.Since(start).Seconds()
	if err != nil {
		return m, fmt.Errorf("nft -f: %w: %s", err, firstLines(string(out), 5))
	}
	if u, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		m.LoaderPeakRSSBytes = u.Maxrss << 10
		m.LoadCPUSeconds = time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
	}
	// The set's elements are committed when nft exits; what the kernel
	// frees of the transaction goes after an RCU grace period.
	time.Sleep(200 * time.Millisecond)
	after, err := kernelMemory()
	if err != nil {
		return m, err
	}
	m.KernelBytes = after - before
	if err := check(&m, sc, topo, true); err != nil {
		return m, err
	}
	if err := measureTraffic(cfg, &m, sc, topo, srv); err != nil {
		return m, err
	}
	// One nft command for both families, as an administrator adds them.
	var adds []string
	for _, s := range sc.servers() {
		set := "allow4"
		if strings.Contains(s.change, ":") {
			set = "allow6"
		}
		adds = append(adds, fmt.Sprintf("add element inet %s %s { %s }", nftTable, set, s.change))
	}
	m.ChangeMillis, err = changeUnderLoad(sc, topo, func() error {
		return run("ip", "netns", "exec", topo.router, "nft", strings.Join(adds, "; "))
	})
	return m, err
}

// startPerf samples the process pid's stacks with `perf record` (a Go
// binary: symbols and frame pointers) until the returned function is
// called.
//
// Possible errors: perf cannot be started.
func startPerf(path string, pid int) (func(), error) {
	cmd := exec.Command("perf", "record", "-F", "999", "-g", "-o", path, "-p", strconv.Itoa(pid))
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf record: %w", err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	}, nil
}

// settledKernelMemory waits for what earlier steps freed to be returned
// (RCU, the workqueues that free BPF maps), then reads kernelMemory.
func settledKernelMemory() (int64, error) {
	time.Sleep(time.Second)
	return kernelMemory()
}

// check probes the server's addresses from the client and fills the
// enforcement check: under a filter the allowed addresses must connect
// and the outside and change addresses must not; with none every one
// must.
//
// Possible errors: ErrNotFiltering; a probe could not be made.
func check(m *ModeResult, sc scenario, topo *topology, filtered bool) error {
	m.AllowedConnects, m.OutsideConnects, m.ChangeConnects = true, false, false
	for _, s := range sc.servers() {
		allowed, err := connects(topo.client, s.allowed, time.Second)
		if err != nil {
			return err
		}
		// A dropped SYN is resent after 1 s: 300 ms tells a drop.
		outside, err := connects(topo.client, s.outside, 300*time.Millisecond)
		if err != nil {
			return err
		}
		change, err := connects(topo.client, s.change, 300*time.Millisecond)
		if err != nil {
			return err
		}
		m.AllowedConnects = m.AllowedConnects && allowed
		m.OutsideConnects = m.OutsideConnects || outside
		m.ChangeConnects = m.ChangeConnects || change
	}
	switch {
	case !m.AllowedConnects:
		return fmt.Errorf("%w: an allowed address does not connect", ErrNotFiltering)
	case filtered && (m.OutsideConnects || m.ChangeConnects):
		return fmt.Errorf("%w: an address outside the policy connects", ErrNotFiltering)
	case !filtered && !(m.OutsideConnects && m.ChangeConnects):
		return errors.New("without a filter, an address outside the policy does not connect: the namespaces are broken")
	}
	return nil
}

// measureTraffic runs cfg.rounds rounds of request/response then bulk
// traffic, and keeps the medians.
//
// Possible errors: the traffic's.
func measureTraffic(cfg config, m *ModeResult, sc scenario, topo *topology, srv *server) error {
	var p50, p99, rps, gbps []float64
	for range cfg.rounds {
		rr, err := requestResponse(topo.client, sc.traffic().allowed, cfg.duration, nil)
		if err != nil {
			return fmt.Errorf("request/response: %w", err)
		}
		p50 = append(p50, micros(rr.percentile(0.50)))
		p99 = append(p99, micros(rr.percentile(0.99)))
		rps = append(rps, rr.perSecond())
		bits, err := bulk(topo.client, sc.traffic().allowed, srv, cfg.duration)
		if err != nil {
			return fmt.Errorf("bulk: %w", err)
		}
		gbps = append(gbps, bits/1e9)
	}
	m.RRP50Micros, m.RRP99Micros, m.RRPerSecond, m.BulkGbitPerSec = median(p50), median(p99), median(rps), median(gbps)
	return nil
}

// changeUnderLoad runs request/response traffic, applies the change
// after 200 ms of it, and returns the milliseconds from the change's
// start until a connection to the change's address of the traffic's
// family succeeds.
//
// Possible errors: the change's; no connection within 30 s; the
// traffic's.
func changeUnderLoad(sc scenario, topo *topology, change func() error) (float64, error) {
	stop := make(chan struct{})
	rrErr := make(chan error, 1)
	go func() {
		_, err := requestResponse(topo.client, sc.traffic().allowed, time.Hour, stop)
		rrErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	err := change()
	if err == nil {
		_, err = firstConnect(topo.client, sc.traffic().change, 2*time.Millisecond, 30*time.Second)
	}
	took := time.Since(start)
	close(stop)
	if e := <-rrErr; err == nil && e != nil {
		err = fmt.Errorf("request/response under the change: %w", e)
	}
	return float64(took.Microseconds()) / 1000, err
}

// processCPU is a process's user and system CPU so far, in seconds.
func processCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	// utime and stime are fields 14 and 15 of stat, 12 and 13 after the
	// name; in clock ticks (USER_HZ, 100 on Linux).
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
