// SPDX-License-Identifier: Apache-2.0

package metricscell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownTimeout bounds how long stop waits for scrapes in flight.
const shutdownTimeout = 5 * time.Second

// Server serves the registry at /metrics, and the probes /healthz and
// /readyz (probes.go), on --prometheus-serve-addr. Its
// start hook listens, so that an address that cannot be listened on fails
// the agent's start; the `serve` job then serves until stop.
type Server struct {
	addr   string
	log    *slog.Logger
	server *http.Server

	mu       sync.Mutex
	listener net.Listener
}

func newServer(addr string, registry *prometheus.Registry, p probes, log *slog.Logger) *Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+HealthzPath, p.healthz)
	mux.HandleFunc("GET "+ReadyzPath, p.readyz)
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	return &Server{
		addr:   addr,
		log:    log,
		server: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
	}
}

// Addr returns the address the server listens on (with the port the kernel
// chose for port 0), or nil if it does not listen: the flag is empty, or
// the hive has not started or has stopped.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		return nil
	}
	return s.listener.Addr()
}

// Start implements cell.HookInterface.
//
// Possible errors: --prometheus-serve-addr cannot be listened on.
func (s *Server) Start(cell.HookContext) error {
	if s.addr == "" {
		return nil
	}
	listener, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("--prometheus-serve-addr %q: %w", s.addr, err)
	}
	s.mu.Lock()
	s.listener = listener
	s.mu.Unlock()
	s.log.Info("Serving Prometheus metrics", "address", listener.Addr().String(), "path", "/metrics")
	return nil
}

// Stop implements cell.HookInterface. The serve job has shut the server
// down by now; this closes the listener if it never served (a later start
// hook failed).
//
// Possible errors: the listener cannot be closed.
func (s *Server) Stop(cell.HookContext) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		return nil
	}
	err := s.listener.Close()
	s.listener = nil
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close metrics listener: %w", err)
	}
	return nil
}

// serve serves /metrics until ctx is cancelled (the hive stops), then
// waits up to shutdownTimeout for scrapes in flight.
func (s *Server) serve(ctx context.Context, health cell.Health) error {
	s.mu.Lock()
	listener := s.listener
	s.mu.Unlock()
	if listener == nil {
		return nil
	}
	served := make(chan error, 1)
	go func() { served <- s.server.Serve(listener) }()
	health.OK("Serving on " + listener.Addr().String())

	select {
	case err := <-served:
		// Serve returns only on failure here: shutdown has not begun.
		return fmt.Errorf("serve metrics on %s: %w", listener.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := s.server.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down metrics server: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics on %s: %w", listener.Addr(), err)
	}
	return nil
}
