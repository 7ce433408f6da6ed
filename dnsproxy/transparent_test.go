// SPDX-License-Identifier: Apache-2.0

package dnsproxy

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

// socketMark is the SO_MARK of a socket.
func socketMark(t *testing.T, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	var mark int
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) { mark, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) }))
	require.NoError(t, serr)
	return mark
}

// The proxy's answers carry AnswerMark, which is not the steering mark
// in the mask they share: the TCP listeners have it, and so the
// connections they accept, and the datagrams sendFrom sends (read with
// SO_RCVMARK on loopback, which keeps the mark).
func TestAnswerMark(t *testing.T) {
	privileged.Test(t)
	if !netnstest.InFreshProcessNetns(t, "dnsproxy-mark", true) {
		return
	}
	require.NotEqual(t, 0x200, AnswerMark&0xf00, "the steering mark's policy route must not match")
	require.Equal(t, AnswerMark, AnswerMark&0xf00, "within the mask")

	pcs, lns, port, err := listen(0, 512)
	require.NoError(t, err)
	defer func() {
		for _, pc := range pcs {
			pc.Close()
		}
		for _, ln := range lns {
			ln.Close()
		}
	}()
	require.Len(t, lns, 2)
	for i, ln := range lns {
		require.Equal(t, AnswerMark, socketMark(t, ln.(*net.TCPListener)), "listener %d", i)
		loopback := netip.AddrPortFrom(netip.MustParseAddr([]string{"127.0.0.1", "::1"}[i]), port)
		client, err := net.DialTimeout("tcp", loopback.String(), 2*time.Second)
		require.NoError(t, err)
		accepted, err := ln.Accept()
		require.NoError(t, err)
		require.Equal(t, AnswerMark, socketMark(t, accepted.(*net.TCPConn)), "accepted by listener %d", i)
		require.Zero(t, socketMark(t, client.(*net.TCPConn)), "the client's socket: the mark is the listener's")
		accepted.Close()
		client.Close()
	}

	for _, family := range []struct{ network, addr string }{{"udp4", "127.0.0.1"}, {"udp6", "::1"}} {
		rx, err := net.ListenUDP(family.network, &net.UDPAddr{IP: net.ParseIP(family.addr)})
		require.NoError(t, err)
		defer rx.Close()
		raw, err := rx.SyscallConn()
		require.NoError(t, err)
		var serr error
		require.NoError(t, raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVMARK, 1) }))
		require.NoError(t, serr)
		to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
		from := netip.AddrPortFrom(to.Addr(), 53)
		require.NoError(t, sendFrom(from, to, []byte("answer")))
		rx.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf, oob := make([]byte, 64), make([]byte, 128)
		n, oobn, _, src, err := rx.ReadMsgUDPAddrPort(buf, oob)
		require.NoError(t, err)
		require.Equal(t, "answer", string(buf[:n]))
		require.Equal(t, from, src)
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		require.NoError(t, err)
		mark := -1
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_MARK && len(m.Data) >= 4 {
				mark = int(binary.NativeEndian.Uint32(m.Data))
			}
		}
		require.Equal(t, AnswerMark, mark, "%s: the datagram's mark", family.network)
	}
}
