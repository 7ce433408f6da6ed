// SPDX-License-Identifier: Apache-2.0

package cnicell

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
)

const (
	// maxRequests bounds the requests served at once, and with
	// endpointapi.MaxMessageSize the memory they hold: a node creates a
	// few pods a second, each ADD waiting for its policy.
	maxRequests = 64
	// checkTimeout bounds CHECK's question to the registry whether the
	// endpoint is still enforced: it is, or it is not registered.
	checkTimeout = 5 * time.Second
	// writeTimeout bounds writing the answer to a client that reads
	// nothing.
	writeTimeout = 5 * time.Second
)

// record is an endpoint the plugin registered, with the attachment it was
// registered for.
type record struct {
	ContainerID string            `json:"containerID"`
	IfName      string            `json:"ifName"`
	Endpoint    endpoint.Endpoint `json:"endpoint"`
	// Network is the network configuration's name; empty for a record
	// of a plugin that did not send it, which no GC lists.
	Network string `json:"network,omitempty"`
}

type server struct {
	sockPath  string
	statePath string // empty: the state directory is off, nothing persists
	registry  endpoint.Registry
	log       *slog.Logger

	source   endpoint.Source
	listener net.Listener
	requests chan struct{} // a token per request served

	// mu orders the requests' changes to the registry and to records,
	// and the state file's writes.
	mu      sync.Mutex
	records map[string]record // by endpoint ID
}

// register takes the cell's source: before the hive starts, so that the
// `endpoints` table waits for the restored endpoints.
func (s *server) register() error {
	source, err := s.registry.NewSource(Owner)
	if err != nil {
		return fmt.Errorf("register the CNI plugin's endpoint source: %w", err)
	}
	s.source = source
	return nil
}

// listen makes the socket, root only, at start: a failure fails the
// start. Clients that connect before the registered endpoints are
// restored wait in the listen backlog.
func (s *server) listen(cell.HookContext) error {
	dir := filepath.Dir(s.sockPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create CNI socket directory (--cni-sock-path): %w", err)
	}
	// A socket an agent listens on is another agent's (of another state
	// directory, told the same --cni-sock-path): replacing it would take
	// its plugin's requests. One nothing listens on was left by an agent
	// that did not stop cleanly.
	if conn, err := net.DialTimeout("unix", s.sockPath, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("--cni-sock-path %s: %w", s.sockPath, ErrSocketInUse)
	}
	if err := os.Remove(s.sockPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale CNI socket (--cni-sock-path): %w", err)
	}
	l, err := net.Listen("unix", s.sockPath)
	if err != nil {
		return fmt.Errorf("CNI socket (--cni-sock-path): %w", err)
	}
	if err := os.Chmod(s.sockPath, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("CNI socket (--cni-sock-path): %w", err)
	}
	s.listener = l
	return nil
}

// close closes the socket (which removes its file) if the job did not.
func (s *server) close(cell.HookContext) error {
	if s.listener != nil {
		s.listener.Close()
	}
	return nil
}

// run upserts the endpoints registered before the agent stopped, says the
// source is initialized, and serves the plugin until the agent stops.
func (s *server) run(ctx context.Context, health cell.Health) error {
	s.restore()
	s.source.Initialized()

	var clients sync.WaitGroup
	defer clients.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { s.listener.Close() })
	defer stop()
	health.OK("Listening on " + s.sockPath)
	s.log.Info("CNI endpoint socket listening", "socket", s.sockPath, "endpoints", s.count())
	for {
		conn, err := s.listener.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept CNI connection: %w", err)
		}
		clients.Go(func() {
			defer conn.Close()
			s.serveConn(ctx, conn)
		})
	}
}

func (s *server) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// serveConn answers one request.
func (s *server) serveConn(ctx context.Context, conn net.Conn) {
	var resp endpointapi.Response
	select {
	case s.requests <- struct{}{}:
		defer func() { <-s.requests }()
		conn.SetReadDeadline(time.Now().Add(endpointapi.ReadTimeout))
		req, err := endpointapi.ReadRequest(conn)
		if err == nil {
			err = s.handle(ctx, req)
		}
		if err == nil && req.Command == endpointapi.Attachments {
			resp.Attachments = s.attachments(req.Network)
		}
		if err != nil {
			s.log.Warn("CNI request failed", "error", err)
			resp.Error = err.Error()
		}
	default:
		resp.Error = fmt.Sprintf("%v: %d requests in progress, the most served at once; try again later", ErrBusy, maxRequests)
	}
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	endpointapi.WriteResponse(conn, resp)
}

// handle carries out req. Its errors name the request.
func (s *server) handle(ctx context.Context, req endpointapi.Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	req.Endpoint = normalize(req.Endpoint)
	var err error
	switch req.Command {
	case endpointapi.Add:
		err = s.add(ctx, req)
	case endpointapi.Del:
		err = s.del(req)
	case endpointapi.Check:
		err = s.check(ctx, req)
	case endpointapi.Attachments:
		// Answered by serveConn: nothing changes.
	}
	if err != nil {
		return fmt.Errorf("%s: %w", req, err)
	}
	return nil
}

// add registers the endpoint, saves it, and waits for its policy. A
// request the registry refuses changes nothing.
func (s *server) add(ctx context.Context, req endpointapi.Request) error {
	id := req.Endpoint.ID()
	if err := s.upsert(req); err != nil {
		return err
	}
	s.log.Info("CNI endpoint registered", "endpoint", id, "container", req.ContainerID, "interface", req.Endpoint.Interface)
	ctx, cancel := context.WithTimeout(ctx, endpointapi.EnforceTimeout)
	defer cancel()
	if err := s.source.WaitEnforced(ctx, id); err != nil {
		// Registered but not yet enforced: the runtime takes the failed
		// ADD back with a DEL.
		return fmt.Errorf("policy not in the kernel within %s: %w", endpointapi.EnforceTimeout, err)
	}
	return nil
}

func (s *server) upsert(req endpointapi.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := req.Endpoint.ID()
	old, hadOld := s.records[id]
	if _, err := s.source.Upsert(req.Endpoint); err != nil {
		return err
	}
	s.records[id] = record{ContainerID: req.ContainerID, IfName: req.IfName, Endpoint: req.Endpoint, Network: req.Network}
	if err := s.save(); err != nil {
		// Unsaved, it would not survive a restart: take it back.
		if hadOld {
			s.records[id] = old
			_, undoErr := s.source.Upsert(old.Endpoint)
			return errors.Join(err, undoErr)
		}
		delete(s.records, id)
		return errors.Join(err, s.source.Delete(id))
	}
	return nil
}

// del deletes the endpoint if this attachment registered it. An endpoint
// that is not registered, or that another attachment registered (a pod's
// new sandbox, added before its old one is deleted), is left as it is
// and no error: DEL is idempotent.
func (s *server) del(req endpointapi.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := req.Endpoint.ID()
	rec, ok := s.records[id]
	if !ok {
		return nil
	}
	if rec.ContainerID != req.ContainerID || rec.IfName != req.IfName {
		s.log.Info("CNI DEL of an endpoint another attachment registered: left alone",
			"endpoint", id, "container", req.ContainerID, "registered by container", rec.ContainerID)
		return nil
	}
	if err := s.source.Delete(id); err != nil {
		return err
	}
	delete(s.records, id)
	if err := s.save(); err != nil {
		// Deleted, but still in the file: keep the record, so that the
		// runtime's retry of the DEL saves again.
		s.records[id] = rec
		return err
	}
	s.log.Info("CNI endpoint removed", "endpoint", id, "container", req.ContainerID)
	return nil
}

// attachments returns the attachments of network's records, in the order
// of their endpoints' names.
func (s *server) attachments(network string) []endpointapi.Attachment {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []endpointapi.Attachment
	for _, rec := range s.records {
		if rec.Network == network {
			out = append(out, endpointapi.Attachment{ContainerID: rec.ContainerID, IfName: rec.IfName,
				Namespace: rec.Endpoint.Namespace, Name: rec.Endpoint.Name})
		}
	}
	slices.SortFunc(out, func(a, b endpointapi.Attachment) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// check compares the registered endpoint with the request, then asks the
// registry whether it is still enforced.
func (s *server) check(ctx context.Context, req endpointapi.Request) error {
	s.mu.Lock()
	rec, ok := s.records[req.Endpoint.ID()]
	s.mu.Unlock()
	switch {
	case !ok:
		return ErrNotRegistered
	case rec.ContainerID != req.ContainerID || rec.IfName != req.IfName:
		return fmt.Errorf("%w: registered by container %s, interface %s", ErrNotRegistered, rec.ContainerID, rec.IfName)
	case !slices.Equal(rec.Endpoint.Addresses, req.Endpoint.Addresses):
		return fmt.Errorf("%w: addresses %v, not %v", ErrMismatch, rec.Endpoint.Addresses, req.Endpoint.Addresses)
	case !maps.Equal(rec.Endpoint.Labels, req.Endpoint.Labels):
		return fmt.Errorf("%w: labels %v, not %v", ErrMismatch, rec.Endpoint.Labels, req.Endpoint.Labels)
	case rec.Endpoint.Interface != req.Endpoint.Interface:
		return fmt.Errorf("%w: interface %q, not %q", ErrMismatch, rec.Endpoint.Interface, req.Endpoint.Interface)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	return s.source.WaitEnforced(ctx, req.Endpoint.ID())
}

// normalize puts an endpoint in the form records compare in: addresses
// sorted without duplicates, no empty label map.
func normalize(ep endpoint.Endpoint) endpoint.Endpoint {
	ep.Addresses = endpoint.SortedAddresses(ep.Addresses)
	if len(ep.Labels) == 0 {
		ep.Labels = nil
	}
	return ep
}
