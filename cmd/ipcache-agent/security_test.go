// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/syncbuf"
)

// inetSocket is an inet socket of a process, as /proc/<pid>/net/{tcp,udp}[6]
// shows it.
type inetSocket struct {
	proto         string // tcp, tcp6, udp, udp6
	local, remote netip.AddrPort
	state         uint8 // the kernel's TCP_* state (UDP uses them too)
}

const tcpListen = 0x0a

// listening reports whether the socket accepts traffic from anyone: a TCP
// socket in LISTEN, or an unconnected UDP socket (UDP has no listen: a
// bound socket receives from any peer).
func (s inetSocket) listening() bool {
	if strings.HasPrefix(s.proto, "tcp") {
		return s.state == tcpListen
	}
	return !s.remote.Addr().IsValid() || s.remote.Port() == 0
}

func (s inetSocket) String() string {
	return fmt.Sprintf("%s %s -> %s state %02X", s.proto, s.local, s.remote, s.state)
}

// processInetSockets returns the inet sockets the process holds: the socket
// inodes of /proc/<pid>/fd looked up in its network namespace's tables.
func processInetSockets(t *testing.T, pid int) []inetSocket {
	t.Helper()
	inodes := map[string]bool{}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	require.NoError(t, err)
	for _, fd := range fds {
		// A descriptor closed since the listing has no link any more.
		if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil {
			if inode, ok := strings.CutPrefix(target, "socket:["); ok {
				inodes[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	var sockets []inetSocket
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		table, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(table)), "\n")
		for _, line := range lines[1:] { // after the header
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
			fields := strings.Fields(line)
			require.GreaterOrEqual(t, len(fields), 10, "%s line %q", proto, line)
			if !inodes[fields[9]] {
				continue
			}
			state, err := strconv.ParseUint(fields[3], 16, 8)
			require.NoError(t, err, line)
			sockets = append(sockets, inetSocket{proto: proto,
				local: procAddrPort(t, fields[1]), remote: procAddrPort(t, fields[2]), state: uint8(state)})
		}
	}
	return sockets
}

// procAddrPort decodes "0100007F:1F90": the address as the kernel prints
// it (32-bit words in host byte order), the port in hex.
func procAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	addrHex, portHex, ok := strings.Cut(s, ":")
	require.True(t, ok, s)
	raw, err := hex.DecodeString(addrHex)
	require.NoError(t, err, s)
	require.True(t, len(raw) == 4 || len(raw) == 16, s)
	for word := 0; word < len(raw); word += 4 {
		binary.NativeEndian.PutUint32(raw[word:], binary.BigEndian.Uint32(raw[word:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	port, err := strconv.ParseUint(portHex, 16, 16)
	require.NoError(t, err, s)
	return netip.AddrPortFrom(addr, uint16(port))
}

// startPrivateAgent runs the agent on its default flags except the paths
// (bpffs, state, shell socket), which are private to the test, and with
// extra; it returns the process and its JSON log. The agent is stopped
// (SIGTERM, clean exit) when the test ends.
func startPrivateAgent(t *testing.T, extra ...string) (*syncbuf.Buffer, int) {
	t.Helper()
	stateDir := filepath.Join(t.TempDir(), "state")
	bpfRoot := filepath.Join(t.TempDir(), "bpf")
	t.Cleanup(func() { unix.Unmount(bpfRoot, unix.MNT_DETACH) })
	args := append([]string{"--state-dir=" + stateDir, "--bpf-root=" + bpfRoot, "--log-format=json",
		"--shell-sock-path=" + filepath.Join(stateDir, "shell.sock")}, extra...)
	cmd := agentCommand(args...)
	var log syncbuf.Buffer
	cmd.Stderr = &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, cmd.Wait(), "agent exit: %s", &log)
	})
	waitAgentStarted(t, &log, cmd.Process.Pid)
	return &log, cmd.Process.Pid
}

// listeningSockets samples the process's listening inet sockets for a
// second (jobs start after the hive has), and fails if they change.
func listeningSockets(t *testing.T, pid int) []inetSocket {
	t.Helper()
	var first []inetSocket
	for i := range 10 {
		var now []inetSocket
		for _, s := range processInetSockets(t, pid) {
			if s.listening() {
				now = append(now, s)
			}
		}
		if i == 0 {
			first = now
			t.Logf("listening inet sockets: %v", now)
		}
		require.Equal(t, first, now, "sample %d", i)
		time.Sleep(100 * time.Millisecond)
	}
	return first
}

// TestPrivilegedNoListeningSocketByDefault: the agent on its defaults
// listens on no network address: no TCP socket in LISTEN and no unconnected
// UDP socket, in IPv4 or IPv6 (the shell is a unix socket).
func TestPrivilegedNoListeningSocketByDefault(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	_, pid := startPrivateAgent(t)
	require.Empty(t, listeningSockets(t, pid), "the agent listens on a network address without being asked")
}

// TestPrivilegedListensOnlyWhereAsked: with --prometheus-serve-addr the
// agent listens on that one address, TCP, and on nothing else.
func TestPrivilegedListensOnlyWhereAsked(t *testing.T) {
	t.Parallel()
	privileged.Test(t)
	log, pid := startPrivateAgent(t, "--prometheus-serve-addr=127.0.0.1:0")

	var serving struct{ Address string }
	for line := range strings.SplitSeq(log.String(), "\n") {
		if strings.Contains(line, `"msg":"Serving Prometheus metrics"`) {
			require.NoError(t, json.Unmarshal([]byte(line), &serving), line)
		}
	}
	addr, err := netip.ParseAddrPort(serving.Address)
	require.NoError(t, err, "the agent logs where it serves metrics: %s", log)
	require.Equal(t, netip.MustParseAddr("127.0.0.1"), addr.Addr())

	sockets := listeningSockets(t, pid)
	require.Len(t, sockets, 1, "exactly one listening inet socket: %v", sockets)
	require.Equal(t, "tcp", sockets[0].proto)
	require.Equal(t, addr, sockets[0].local)

	resp, err := http.Get("http://" + addr.String() + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "that socket is the metrics server")
}
