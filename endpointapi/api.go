// SPDX-License-Identifier: Apache-2.0

package endpointapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
)

// DefaultSockPath is where the agent serves the endpoint socket, and where
// the plugin looks for it, unless told otherwise (--cni-sock-path, the
// network configuration's socketPath).
const DefaultSockPath = "/run/ipcache-agent/cni.sock"

const (
	// MaxMessageSize bounds a request and a response: a request is one
	// endpoint, whose labels and addresses the agent bounds far below it.
	MaxMessageSize = 64 << 10

	// DialTimeout bounds connecting to the socket: a listening agent
	// accepts at once, and a runtime must not wait on one that is not
	// there.
	DialTimeout = 2 * time.Second

	// RequestTimeout bounds the whole exchange on the client's side when
	// its context has no earlier deadline. It is longer than the agent's
	// own bound on waiting for an endpoint's policy (EnforceTimeout), so
	// that the client hears the agent's reason rather than its own
	// timeout.
	RequestTimeout = 90 * time.Second

	// EnforceTimeout bounds how long the agent waits for a new endpoint's
	// policy to be in the kernel before it answers ADD with an error.
	EnforceTimeout = 60 * time.Second

	// ReadTimeout bounds how long the server waits for a request once a
	// client connected.
	ReadTimeout = 5 * time.Second

	// MaxAttachmentsSize bounds the answer to Attachments, which the
	// plugin reads: one attachment per endpoint the agent may hold
	// (--endpoint-max-entries), a few hundred bytes each. The agent reads
	// no message this large: its requests stay under MaxMessageSize.
	MaxAttachmentsSize = 32 << 20
)

// Command is what a request asks, named as CNI names its commands.
type Command string

const (
	// Add registers the endpoint, replacing an earlier one of the same
	// name, and is answered once its policy is in the kernel.
	Add Command = "ADD"
	// Del removes the endpoint of that name if the same container and
	// interface registered it; anything else is no error.
	Del Command = "DEL"
	// Check answers with an error unless the endpoint is registered by
	// that container and interface with those labels, addresses and
	// host-side interface.
	Check Command = "CHECK"
	// Attachments answers with the attachments the agent holds endpoints
	// of the request's network for: the plugin's GC deletes those the
	// runtime no longer lists, one DEL each, so that an attachment added
	// meanwhile is never taken for a stale one (DEL removes only the
	// attachment's own endpoint).
	Attachments Command = "ATTACHMENTS"
)

// Request is one call of the plugin.
type Request struct {
	Command Command `json:"command"`

	// ContainerID and IfName are the CNI attachment (CNI_CONTAINERID,
	// CNI_IFNAME) the endpoint was made for: DEL removes the endpoint
	// only for the attachment that registered it, so that the DEL of a
	// pod's old sandbox leaves its new one alone.
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`

	// Endpoint is the endpoint: its namespace and name always, and for
	// ADD and CHECK its labels, addresses and host-side interface.
	Endpoint endpoint.Endpoint `json:"endpoint"`

	// Network is the network configuration's name: ADD records it with
	// the endpoint, and Attachments lists that network's alone, so that
	// the GC of one network leaves another's endpoints alone.
	Network string `json:"network,omitempty"`
}

// Attachment is an attachment the agent holds an endpoint for, as
// Attachments answers it.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
}

// String names the request in errors and logs.
func (r Request) String() string {
	if r.Command == Attachments {
		return fmt.Sprintf("CNI %s of network %s", r.Command, r.Network)
	}
	return fmt.Sprintf("CNI %s of endpoint %s (container %s, interface %s)",
		r.Command, r.Endpoint.ID(), r.ContainerID, r.IfName)
}

// Validate reports what the request lacks for its command.
//
// Possible errors: ErrBadMessage (wrapped, saying what is missing).
func (r Request) Validate() error {
	var missing string
	switch {
	case r.Command == Attachments && r.Network == "":
		return fmt.Errorf("%w: CNI %s: no network name", ErrBadMessage, r.Command)
	case r.Command == Attachments:
		return nil
	case r.Command != Add && r.Command != Del && r.Command != Check:
		return fmt.Errorf("%w: unknown command %q", ErrBadMessage, r.Command)
	case r.ContainerID == "":
		missing = "container ID"
	case r.IfName == "":
		missing = "interface name"
	case r.Endpoint.Namespace == "" || r.Endpoint.Name == "":
		missing = "endpoint namespace and name"
	case r.Command != Del && len(r.Endpoint.Addresses) == 0:
		missing = "addresses (the previous plugin's result has none)"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s: no %s", ErrBadMessage, r, missing)
}

// Response is the agent's answer: empty when the request succeeded,
// except for Attachments'.
type Response struct {
	Error       string       `json:"error,omitempty"`
	Attachments []Attachment `json:"attachments,omitempty"`
}

// Call sends req to the agent listening on sockPath and waits for its
// answer, at most until ctx's deadline or RequestTimeout.
//
// Possible errors: ErrAgentNotRunning (wrapped, with the dial's error)
// when nothing accepts on sockPath; ErrRejected (wrapped, with the
// agent's message) when the agent answered with an error; ErrBadMessage
// and ErrMessageTooLarge (wrapped) for an answer that does not decode;
// ctx's and the connection's errors.
func Call(ctx context.Context, sockPath string, req Request) error {
	_, err := exchange(ctx, sockPath, req, MaxMessageSize)
	return err
}

// ListAttachments asks the agent on sockPath for the attachments it holds
// endpoints of network for (Attachments).
//
// Possible errors: those of Call.
func ListAttachments(ctx context.Context, sockPath, network string) ([]Attachment, error) {
	resp, err := exchange(ctx, sockPath, Request{Command: Attachments, Network: network}, MaxAttachmentsSize)
	return resp.Attachments, err
}

// exchange sends req and reads an answer of at most maxResponse bytes.
func exchange(ctx context.Context, sockPath string, req Request, maxResponse int) (Response, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	dialer := net.Dialer{Timeout: DialTimeout}
	conn, err := dialer.DialContext(ctx, "unix", sockPath)
	if err != nil {
		return Response{}, fmt.Errorf("%w: %w", ErrAgentNotRunning, err)
	}
	defer conn.Close()
	// The connection's reads and writes end when ctx does (its deadline or
	// its cancellation), and ctx says why.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	body, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("encode %s: %w", req, err)
	}
	if len(body) > MaxMessageSize {
		return Response{}, fmt.Errorf("%s: %w (%d bytes, at most %d)", req, ErrMessageTooLarge, len(body), MaxMessageSize)
	}
	if _, err := conn.Write(body); err != nil {
		return Response{}, fmt.Errorf("send %s: %w", req, err)
	}
	// The end of the request is the end of the stream.
	if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
		return Response{}, fmt.Errorf("send %s: %w", req, err)
	}
	var resp Response
	if err := readMessage(conn, &resp, maxResponse); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Response{}, fmt.Errorf("answer to %s: %w", req, err)
	}
	if resp.Error != "" {
		return Response{}, fmt.Errorf("%w: %s", ErrRejected, resp.Error)
	}
	return resp, nil
}

// ReadRequest reads one request from r, the connection's reading side.
//
// Possible errors: ErrMessageTooLarge, ErrBadMessage (wrapped), r's.
func ReadRequest(r io.Reader) (Request, error) {
	var req Request
	err := readMessage(r, &req, MaxMessageSize)
	return req, err
}

// WriteResponse writes resp to w.
//
// Possible errors: w's.
func WriteResponse(w io.Writer, resp Response) error {
	body, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	// A message cut to size says why rather than failing to decode.
	if len(body) > MaxMessageSize && len(resp.Error) > MaxMessageSize/2 {
		body, _ = json.Marshal(Response{Error: resp.Error[:MaxMessageSize/2] + "..."})
	}
	_, err = w.Write(body)
	return err
}

// readMessage decodes the one JSON value r holds until its end, reading at
// most limit bytes.
func readMessage(r io.Reader, v any, limit int) error {
	body, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return err
	}
	if len(body) > limit {
		return fmt.Errorf("%w (more than %d bytes)", ErrMessageTooLarge, limit)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: empty", ErrBadMessage)
		}
		return fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: more than one value", ErrBadMessage)
	}
	return nil
}
