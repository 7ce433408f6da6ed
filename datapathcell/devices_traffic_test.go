// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The recreated device's network: the endpoint (eth0 in its namespace,
// recreatedEP) behind recreatedDevice in the agent's namespace, which has
// an address the policy allows the endpoint to reach and one it denies.
const (
	recreatedDevice  = "veth-rc0"
	recreatedEP      = "10.200.9.1/24"
	recreatedAllowed = "10.200.9.2"
	recreatedDenied  = "10.200.9.3"
	recreatedRounds  = 5
)

// TestPrivilegedDeviceRecreatedIsEnforced: the device named in --devices
// is deleted and created again under its name (a pod restart), five times,
// while the endpoint sends a denied flow (an echo request every
// millisecond, through every round): no request ever gets an answer, and
// once the device is up the allowed address answers, so the device
// carries traffic with the program on it. It logs how long after the
// device's creation the program was attached, and how long before the
// device was up. Not parallel: the agent must attach within the few tens
// of milliseconds between the device's creation and its being up, a race
// that CPU taken by the package's other tests would tilt.
func TestPrivilegedDeviceRecreatedIsEnforced(t *testing.T) {
	privileged.Test(t)
	ep := newTestNetns(t, "rcep")
	host := newTestNetns(t, "rchost")
	if os.Getenv(testNetnsEnv+"_RCHOST") == "" {
		createRecreatedVeth(t, ep, host)
		// Without the agent the denied address answers: the test can fail.
		require.Eventually(t, func() bool { return pingFrom(ep, recreatedDenied) }, 10*time.Second, 50*time.Millisecond)
	}
	if !netnstest.InProcessNetns(t, host, testNetnsEnv+"_RCEP="+ep, testNetnsEnv+"_RCHOST="+host) {
		return
	}

	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	// The agent mounts no bpffs from the mount namespace `ip netns exec`
	// made; the test's pins need not outlive it.
	require.NoError(t, privileged.MountBPFFS(t, bpfRoot))
	policyDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(policyDir, "devices.yaml"),
		[]byte(fmt.Sprintf("name: devices\negress:\n  - toCIDR: [%q]\n", recreatedAllowed+"/32")), 0o600))
	h := cells.NewHive(cells.ControlPlane)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	require.NoError(t, flags.Parse([]string{"--bpf-root=" + bpfRoot, "--state-dir=" + t.TempDir(),
		"--policy-dir=" + policyDir, "--devices=" + recreatedDevice}))
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	require.Eventually(t, func() bool {
		got, err := bpfmaps.ReadEnforcement(bpfRoot)
		return err == nil && got[policy.Egress] && !got[policy.Ingress]
	}, 20*time.Second, 10*time.Millisecond, "egress enforced")
	require.True(t, pingFrom(ep, recreatedAllowed), "the allowed address answers")
	require.False(t, pingFrom(ep, recreatedDenied), "the denied address does not")

	prober := startDeniedProber(t, ep, recreatedDenied)
	var worstAttach, leastMargin time.Duration
	leastMargin = time.Hour
	for round := range recreatedRounds {
		out, err := exec.Command("ip", "link", "del", recreatedDevice).CombinedOutput()
		require.NoError(t, err, "%s", out)
		time.Sleep(50 * time.Millisecond)

		attached := make(chan time.Time, 1)
		announced := announcedAt(t, recreatedDevice)
		created := time.Now()
		go func() {
			for time.Since(created) < 10*time.Second {
				if n, err := tcxPrograms(recreatedDevice); err == nil && n == 2 {
					attached <- time.Now()
					return
				}
				time.Sleep(50 * time.Microsecond)
			}
			close(attached)
		}()
		up := createRecreatedVeth(t, ep, "")
		at, ok := <-attached
		require.True(t, ok, "round %d: the program is attached to the new device", round)
		newLink := <-announced
		require.Eventually(t, func() bool { return pingFrom(ep, recreatedAllowed) }, 10*time.Second, 20*time.Millisecond,
			"round %d: the new device carries the allowed traffic", round)
		t.Logf("round %d: attached %v after netlink announced the device (%v after `ip link add` began), %v before it was up",
			round, at.Sub(newLink).Round(time.Microsecond), at.Sub(created).Round(time.Microsecond), up.Sub(at).Round(time.Microsecond))
		worstAttach = max(worstAttach, at.Sub(newLink))
		leastMargin = min(leastMargin, up.Sub(at))
		require.Zero(t, prober.answered.Load(), "round %d: a denied request was answered", round)
	}
	sent, answered := prober.stop()
	t.Logf("%d denied echo requests sent across %d recreations, %d answered; attached at most %v after netlink announced the device, at least %v before it was up",
		sent, recreatedRounds, answered, worstAttach.Round(time.Microsecond), leastMargin.Round(time.Microsecond))
	require.Greater(t, sent, int64(recreatedRounds*50), "denied requests sent while the device was there")
	require.Zero(t, answered, "denied requests answered")

	pins, err := os.ReadDir(bpfmaps.LinksDir(bpfRoot))
	require.NoError(t, err)
	var names []string
	for _, p := range pins {
		names = append(names, p.Name())
	}
	require.Equal(t, []string{recreatedDevice + "-egress", recreatedDevice + "-ingress"}, names,
		"one pinned link per hook, of the device as it is now")
}

// createRecreatedVeth makes the veth between the agent's namespace (host,
// or the calling process's if "") and ep, with its addresses, and returns
// when the device was set up.
func createRecreatedVeth(t *testing.T, ep, host string) time.Time {
	t.Helper()
	var prefix []string
	if host != "" {
		prefix = []string{"-n", host}
	}
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append(slices.Clone(prefix), args...)...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	}
	ipEP := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", ep}, args...)...).CombinedOutput()
		require.NoError(t, err, "ip -n %s %s: %s", ep, strings.Join(args, " "), out)
	}
	ip("link", "add", recreatedDevice, "type", "veth", "peer", "name", "eth0", "netns", ep)
	ipEP("addr", "add", recreatedEP, "dev", "eth0")
	ipEP("link", "set", "lo", "up")
	ipEP("link", "set", "eth0", "up")
	ip("addr", "add", recreatedAllowed+"/24", "dev", recreatedDevice)
	ip("addr", "add", recreatedDenied+"/24", "dev", recreatedDevice)
	ip("link", "set", recreatedDevice, "up")
	return time.Now()
}

// announcedAt returns a channel that gets the time netlink announces a
// new device of that name in the calling process's namespace.
func announcedAt(t *testing.T, device string) <-chan time.Time {
	t.Helper()
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	require.NoError(t, netlink.LinkSubscribe(updates, done))
	at := make(chan time.Time, 1)
	go func() {
		defer func() {
			close(done)
			for range updates {
			}
		}()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					close(at)
					return
				}
				if u.Header.Type == unix.RTM_NEWLINK && u.Link.Attrs().Name == device {
					at <- time.Now()
					return
				}
			case <-timeout:
				close(at)
				return
			}
		}
	}()
	return at
}

// pingFrom reports whether one echo request from ns to addr is answered
// within half a second.
func pingFrom(ns, addr string) bool {
	return exec.Command("ip", "netns", "exec", ns, "ping", "-n", "-q", "-c", "1", "-W", "0.5", addr).Run() == nil
}

// deniedProber sends an echo request to a denied address every
// millisecond from a namespace, through device deletions (a send that
// fails for want of a route is not counted), and counts the answers.
type deniedProber struct {
	fd       int
	sent     atomic.Int64
	answered atomic.Int64
	quit     chan struct{}
	done     sync.WaitGroup
}

func startDeniedProber(t *testing.T, ns, dst string) *deniedProber {
	t.Helper()
	p := &deniedProber{quit: make(chan struct{})}
	require.NoError(t, netnstest.InNetns(t, ns, func() error {
		var err error
		p.fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	}))
	tv := unix.NsecToTimeval((20 * time.Millisecond).Nanoseconds())
	require.NoError(t, unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	to := &unix.SockaddrInet4{Addr: netip.MustParseAddr(dst).As4()}
	id := uint16(os.Getpid() + 7)
	p.done.Add(2)
	go func() {
		defer p.done.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for seq := uint16(0); ; seq++ {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			if unix.Sendto(p.fd, echo(id, seq), 0, to) == nil {
				p.sent.Add(1)
			}
		}
	}()
	go func() {
		defer p.done.Done()
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(p.fd, buf, 0)
			select {
			case <-p.quit:
				return
			default:
			}
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return
			}
			ihl := int(buf[0]&0x0f) * 4
			if n < ihl+8 {
				continue
			}
			icmp := buf[ihl:n]
			if icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id {
				p.answered.Add(1)
			}
		}
	}()
	return p
}

// stop stops sending, waits a moment for late answers, and returns the
// requests sent and the answers.
func (p *deniedProber) stop() (sent, answered int64) {
	time.Sleep(200 * time.Millisecond)
	close(p.quit)
	p.done.Wait()
	unix.Close(p.fd)
	return p.sent.Load(), p.answered.Load()
}

// echo is an ICMP echo request with its checksum.
func echo(id, seq uint16) []byte {
	pkt := make([]byte, 16)
	pkt[0] = 8
	binary.BigEndian.PutUint16(pkt[4:], id)
	binary.BigEndian.PutUint16(pkt[6:], seq)
	var sum uint32
	for i := 0; i < len(pkt); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(pkt[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(pkt[2:], ^uint16(sum))
	return pkt
}
