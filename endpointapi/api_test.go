// SPDX-License-Identifier: Apache-2.0

package endpointapi

import (
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
)

func addRequest() Request {
	return Request{
		Command:     Add,
		ContainerID: "c1",
		IfName:      "eth0",
		Endpoint: endpoint.Endpoint{
			Namespace: "shop", Name: "web-1",
			Labels:    map[string]string{"app": "web"},
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.1.5")},
			Interface: "veth1",
		},
	}
}

// serveOne listens on a socket in a temporary directory and answers each
// connection with answer(request, error reading it).
func serveOne(t *testing.T, answer func(net.Conn, Request, error)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cni.sock")
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			req, err := ReadRequest(conn)
			answer(conn, req, err)
			conn.Close()
		}
	})
	return path
}

func TestCallRoundTrip(t *testing.T) {
	var got Request
	path := serveOne(t, func(conn net.Conn, req Request, err error) {
		require.NoError(t, err)
		got = req
		WriteResponse(conn, Response{})
	})
	require.NoError(t, Call(context.Background(), path, addRequest()))
	require.Equal(t, addRequest(), got)
}

func TestCallRejected(t *testing.T) {
	path := serveOne(t, func(conn net.Conn, _ Request, _ error) {
		WriteResponse(conn, Response{Error: "address 10.0.1.5 in use by shop/db-1"})
	})
	err := Call(context.Background(), path, addRequest())
	require.ErrorIs(t, err, ErrRejected)
	require.ErrorContains(t, err, "address 10.0.1.5 in use by shop/db-1")
}

func TestCallNoAgent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cni.sock")
	err := Call(context.Background(), path, addRequest())
	require.ErrorIs(t, err, ErrAgentNotRunning)
	require.ErrorContains(t, err, "ipcache-agent is not running: dial unix "+path)
}

func TestCallDeadline(t *testing.T) {
	release := make(chan struct{})
	path := serveOne(t, func(net.Conn, Request, error) { <-release })
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := Call(ctx, path, addRequest())
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCallAnswerTooLarge(t *testing.T) {
	path := serveOne(t, func(conn net.Conn, _ Request, _ error) {
		io.WriteString(conn, `{"error":"`+strings.Repeat("x", MaxMessageSize)+`"}`)
	})
	require.ErrorIs(t, Call(context.Background(), path, addRequest()), ErrMessageTooLarge)
}

func TestReadRequestBounds(t *testing.T) {
	_, err := ReadRequest(strings.NewReader(strings.Repeat(" ", MaxMessageSize+1)))
	require.ErrorIs(t, err, ErrMessageTooLarge)
	_, err = ReadRequest(strings.NewReader(""))
	require.ErrorIs(t, err, ErrBadMessage)
	_, err = ReadRequest(strings.NewReader(`{"command":"ADD"} {}`))
	require.ErrorIs(t, err, ErrBadMessage)
	_, err = ReadRequest(strings.NewReader(`{"command":`))
	require.ErrorIs(t, err, ErrBadMessage)
}

func TestWriteResponseCutsLongErrors(t *testing.T) {
	var b strings.Builder
	require.NoError(t, WriteResponse(&b, Response{Error: strings.Repeat("x", MaxMessageSize)}))
	require.LessOrEqual(t, b.Len(), MaxMessageSize)
	var resp Response
	require.NoError(t, readMessage(strings.NewReader(b.String()), &resp, MaxMessageSize))
	require.True(t, strings.HasSuffix(resp.Error, "..."))
}

func TestValidate(t *testing.T) {
	require.NoError(t, addRequest().Validate())
	del := addRequest()
	del.Command, del.Endpoint.Addresses = Del, nil
	require.NoError(t, del.Validate())

	for name, change := range map[string]func(*Request){
		"unknown command":            func(r *Request) { r.Command = "GC" },
		"no container ID":            func(r *Request) { r.ContainerID = "" },
		"no interface name":          func(r *Request) { r.IfName = "" },
		"no endpoint namespace":      func(r *Request) { r.Endpoint.Namespace = "" },
		"no addresses (the previous": func(r *Request) { r.Endpoint.Addresses = nil },
		"no network name":            func(r *Request) { r.Command = Attachments },
	} {
		req := addRequest()
		change(&req)
		err := req.Validate()
		require.ErrorIs(t, err, ErrBadMessage, name)
		require.ErrorContains(t, err, strings.TrimPrefix(name, "unknown command"), name)
	}
}

// ListAttachments sends the network and reads an answer larger than a
// request may be: one attachment per endpoint the agent holds.
func TestListAttachments(t *testing.T) {
	var got Request
	var want []Attachment
	for i := range 2000 {
		want = append(want, Attachment{ContainerID: strings.Repeat("c", 60) + strconv.Itoa(i), IfName: "eth0", Namespace: "shop", Name: "web-" + strconv.Itoa(i)})
	}
	path := serveOne(t, func(conn net.Conn, req Request, err error) {
		require.NoError(t, err)
		got = req
		require.NoError(t, WriteResponse(conn, Response{Attachments: want}))
	})
	attachments, err := ListAttachments(context.Background(), path, "pods")
	require.NoError(t, err)
	require.Equal(t, Request{Command: Attachments, Network: "pods"}, got)
	require.NoError(t, got.Validate())
	require.Equal(t, want, attachments)
	require.Equal(t, "CNI ATTACHMENTS of network pods", got.String())
}
