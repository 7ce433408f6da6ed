// SPDX-License-Identifier: Apache-2.0

package netnstest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// EchoTCP serves TCP on addr (host:port) in the network namespace ns: every
// connection gets back what it sends. The listener and every connection it
// accepted are closed, and its goroutines waited for, when the test ends.
func EchoTCP(t testing.TB, ns, addr string) {
	t.Helper()
	var l net.Listener
	if err := InNetns(t, ns, func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("echo server on %s in netns %s: %v", addr, ns, err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { io.Copy(c, c) })
		}
	})
}
