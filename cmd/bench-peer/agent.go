// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// metricsAddr is where the agent serves /metrics and /readyz, in the
// router namespace.
const metricsAddr = "127.0.0.1:9962"

// agentRun is the agent binary running in the router namespace over a
// private bpffs, state and policy directory.
type agentRun struct {
	binary, router                     string
	bpfRoot, stateDir, policyDir, sock string
	cmd                                *exec.Cmd
	exited                             chan error
	log                                *os.File
	http                               *http.Client
}

// newAgentRun prepares the directories under work and mounts the bpffs
// (the agent mounts none from `ip netns exec`'s mount namespace).
//
// Possible errors: making the directories; mount(2)'s.
func newAgentRun(binary, router, work string) (*agentRun, error) {
	a := &agentRun{binary: binary, router: router,
		bpfRoot: filepath.Join(work, "bpf"), stateDir: filepath.Join(work, "state"),
		policyDir: filepath.Join(work, "policies"), sock: filepath.Join(work, "shell.sock")}
	for _, d := range []string{a.bpfRoot, a.stateDir, a.policyDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := unix.Mount("bpf", a.bpfRoot, "bpf", 0, "mode=0700"); err != nil {
		return nil, fmt.Errorf("mount bpffs at %s: %w", a.bpfRoot, err)
	}
	a.http = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dial(router, strings.Split(addr, ":")[0], 9962, 2*time.Second)
		},
	}}
	return a, nil
}

// start starts the agent enforcing on the client's device, its maps sized
// for n prefixes.
//
// Possible errors: the agent cannot be started.
func (a *agentRun) start(n int) error {
	// The agent's defaults (512000, 16384) unless N needs more.
	ipcacheMax, policyMax := strconv.Itoa(max(n+4096, 512000)), strconv.Itoa(max(n+4096, 16384))
	var err error
	if a.log, err = os.Create(filepath.Join(filepath.Dir(a.bpfRoot), "agent.log")); err != nil {
		return err
	}
	a.cmd = exec.Command("ip", "netns", "exec", a.router, a.binary,
		"--bpf-root="+a.bpfRoot, "--state-dir="+a.stateDir, "--policy-dir="+a.policyDir,
		"--shell-sock-path="+a.sock, "--devices="+routerClientDev,
		"--prometheus-serve-addr="+metricsAddr,
		"--ipcache-map-max-entries="+ipcacheMax, "--policy-map-max-entries="+policyMax)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", a.binary, err)
	}
	a.exited = make(chan error, 1)
	go func() { a.exited <- a.cmd.Wait() }()
	return nil
}

// waitEnforced polls the agent's probes and metrics until it is ready
// (every table initialized, no scope degraded) and both the ipcache and
// the policy map's writers wrote at least n keys: each of the n CIDRs is
// a prefix of its own identity, with one allow entry.
//
// Possible errors: the agent exited; not enforced within timeout.
func (a *agentRun) waitEnforced(n int, poll, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		select {
		case err := <-a.exited:
			a.exited <- err
			return fmt.Errorf("the agent exited: %v (log: %s)", err, a.log.Name())
		default:
		}
		ready, status := a.ready()
		if ready {
			ipc, pol, err := a.mapWrites()
			if err == nil && ipc >= uint64(n) && pol >= uint64(n) {
				// The ipcache map's writer has the router's own
				// addresses too: its status says when none is left.
				status, err := a.ipcacheStatus()
				if err == nil && status.Pending == 0 && status.Error == 0 && status.Done >= n {
					// The agent switches egress on only once its entries
					// are written (make before break): after the counts.
					enforced, err := bpfmaps.ReadEnforcement(a.bpfRoot)
					if err == nil && enforced[policy.Egress] {
						return nil
					}
					last = fmt.Sprintf("maps written, egress not enforced yet (%v)", err)
				} else {
					last = fmt.Sprintf("ipcache-status %+v (%v)", status, err)
				}
			} else {
				last = fmt.Sprintf("ready; map writes: ipcache %d, policy %d of %d (%v)", ipc, pol, n, err)
			}
		} else {
			last = status
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not enforced within %s: %s (log: %s)", timeout, last, a.log.Name())
		}
		time.Sleep(poll)
	}
}

func (a *agentRun) ready() (bool, string) {
	resp, err := a.http.Get("http://" + metricsAddr + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(body))
}

type ipcacheCounts struct{ Done, Pending, Error int }

// ipcacheStatus is the shell's `datapath/ipcache-status`: the ipcache
// map writer's entries done, pending and failing. It speaks to the shell
// in process, as `ipcache-agent shell` does: starting that client was
// 50 ms, which the agent's load at 1,000 prefixes counted (docs/SCALE.md).
//
// Possible errors: the shell's.
func (a *agentRun) ipcacheStatus() (ipcacheCounts, error) {
	var out bytes.Buffer
	if err := cells.ShellExchange(a.sock, "datapath/ipcache-status -o json", &out); err != nil {
		return ipcacheCounts{}, err
	}
	var status struct {
		Counts ipcacheCounts `json:"counts"`
	}
	err := json.Unmarshal(out.Bytes(), &status)
	return status.Counts, err
}

// mapWrites reads the keys written and skipped as unchanged of the
// ipcache and policy maps from /metrics.
//
// Possible errors: the request's.
func (a *agentRun) mapWrites() (ipcache, policy uint64, err error) {
	resp, err := a.http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "ipcache_agent_map_writes") {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasSuffix(name, `{map="ipcache"}`):
			ipcache += uint64(v)
		case strings.HasSuffix(name, `{map="policy"}`):
			policy += uint64(v)
		}
	}
	return ipcache, policy, s.Err()
}

// pid is the agent's process id (`ip netns exec` execs the agent).
func (a *agentRun) pid() int { return a.cmd.Process.Pid }

// stop stops the agent (SIGTERM, SIGKILL after 20 s), runs its cleanup
// (detach, unpin, state) and unmounts the bpffs.
func (a *agentRun) stop() {
	if a.cmd != nil {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.exited:
		case <-time.After(20 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.exited
		}
		a.cmd = nil
	}
	if out, err := exec.Command("ip", "netns", "exec", a.router, a.binary, "cleanup",
		"--bpf-root="+a.bpfRoot, "--state-dir="+a.stateDir, "--shell-sock-path="+a.sock).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-peer: agent cleanup: %v: %s\n", err, out)
	}
	if err := unix.Unmount(a.bpfRoot, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		fmt.Fprintf(os.Stderr, "bench-peer: unmount %s: %v\n", a.bpfRoot, err)
	}
	if a.log != nil {
		a.log.Close()
	}
}
